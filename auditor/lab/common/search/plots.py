"""Figures of capacity lab III (PNG, Agg backend): capacity and facts on log-log axes with their fits,
the attention-versus-MLP heat map, and the loss curves with the detected stages shaded."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.ticker
import numpy as np
import pandas as pd

from auditor.lab.common.search.summary import (
    budget_fit,
    capacity_fits,
    cell_grid,
    converged_mask,
    convergence_recorded,
    facts_fits,
    final_budget,
    seed_interval,
    tradeoff_cells,
)
from auditor.lab.figures import heatmap, plt, save

_KIND_AXIS = {"linear": "$d^2$ (parameters)", "mlp": "$m d$ (parameters)"}


def _seeds_and_means(ax, rows: pd.DataFrame, value: str, fail: str, color: str, name: str = "") -> None:
    """Every seed (filled: converged; hollow circle: step-limited; hollow triangle: search never failed)
    and the mean over converged seeds per size with its 95% interval over seeds as an error bar."""
    prefix = f"{name}: " if name else ""
    recorded = convergence_recorded(rows)
    done = converged_mask(rows)
    bracketed = rows[fail].notna()
    classes = [
        (
            done & bracketed,
            dict(color=color),
            "seed, converged (fitted)" if recorded else "seed (convergence not recorded)",
        ),
        (
            ~done & bracketed,
            dict(facecolors="none", edgecolors=color),
            "seed, step-limited: first failing size still improving (not fitted)",
        ),
        (
            ~bracketed,
            dict(facecolors="none", edgecolors=color, marker="^"),
            "seed, search never failed: lower bound (not fitted)",
        ),
    ]
    for mask, style, label in classes:
        part = rows[mask & (rows[value] > 0)]
        if len(part):
            ax.scatter(
                part["parameters"], part[value], s=16, alpha=0.6, lw=0.9, label=prefix + label, **style
            )
    ok = rows[done & bracketed & (rows[value] > 0)]
    keys = [k for k in ("d", "width", "parameters") if k in ok]  # one size (two sizes may share P)
    stats_ = [(part["parameters"].iloc[0], part[value].mean(), *seed_interval(part[value]), len(part))
              for _, part in ok.groupby(keys)]
    if stats_:
        p, mean, lo, hi, n = (np.array(v, dtype=float) for v in zip(*stats_))
        err = np.vstack([mean - np.where(np.isnan(lo), mean, lo), np.where(np.isnan(hi), mean, hi) - mean])
        ax.errorbar(
            p,
            mean,
            yerr=err,
            fmt="o",
            color=color,
            ms=5,
            capsize=3,
            lw=1.2,
            label=prefix
            + f"mean of converged seeds, 95% interval (n = {int(n.min())}-{int(n.max())} per size)",
        )


def plot_capacity(rows: pd.DataFrame, path: str | Path) -> Path:
    """Capacity N against parameters (d^2 or m d), one panel per memory kind, log-log.

    Dots are seeds (hollow: step-limited or never failed, left out of the fits), the error bars the mean
    over converged seeds with its 95% interval, the solid line the power-law fit, the dashed line the
    paper's guide parameters = c N ln N, the dotted one the same law with our fitted c and the band its
    95% interval.
    """
    kinds = [k for k in ("linear", "mlp") if k in set(rows["kind"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.8 * len(kinds), 4.6), squeeze=False)
    fits = capacity_fits(rows)
    for ax, kind in zip(axes[0], kinds):
        sub = rows[(rows["kind"] == kind) & (rows["capacity"] > 1)]
        fit = fits[kind]
        _seeds_and_means(ax, sub, "capacity", "first_fail", "tab:blue")
        grid_p = np.geomspace(sub["parameters"].min() * 0.8, sub["parameters"].max() * 1.25, 100)
        if fit["power"] is not None:
            p = fit["power"]
            ax.plot(grid_p, p.predict(grid_p), "-", color="tab:red", lw=1,
                    label=f"fit N = {p.constant:.2g} P^{p.exponent:.2f}±{p.exponent_se:.2f}")
        n_grid = np.geomspace(max(sub["capacity"].min() * 0.6, 2), sub["capacity"].max() * 1.6, 100)
        ax.plot(fit["guide"] * n_grid * np.log(n_grid), n_grid, "--", color="gray",
                label=f"paper: P = {fit['guide']} N ln N")
        if fit["constant"] is not None:
            c = fit["constant"]
            lo, hi = c.ci95()
            ax.plot(c.constant * n_grid * np.log(n_grid), n_grid, ":", color="black",
                    label=f"ours: P = {c.constant:.2f} N ln N (95% {lo:.2f}-{hi:.2f})")
            ax.fill_betweenx(
                n_grid,
                lo * n_grid * np.log(n_grid),
                hi * n_grid * np.log(n_grid),
                color="black",
                alpha=0.08,
                lw=0,
            )
        seeds = ",".join(map(str, fit["seeds"]))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(_KIND_AXIS[kind])
        ax.set_ylabel("capacity N (99% of all items)")
        ax.set_title(f"{kind} associative memory, seeds {seeds}\n{fit['points']} rows fitted, left out: "
                     f"{fit['step_limited']} step-limited, {fit['censored']} never failed", fontsize=9)
        ax.legend(fontsize=6.5)
        ax.grid(alpha=0.3, which="both")
    return save(fig, path)


def plot_facts(rows: pd.DataFrame, path: str | Path) -> Path:
    """Facts stored (S R at 99% accuracy) against trainable parameters, log-log: every seed (hollow:
    step-limited or never failed, not fitted), the mean over converged seeds with its 95% interval, and
    the fitted slope with its 95% band."""
    rows = final_budget(rows)
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    fits = facts_fits(rows)
    for (architecture, sub), color in zip(
        rows[rows["facts"] > 0].groupby("architecture"), ("tab:blue", "tab:orange", "tab:green")
    ):
        _seeds_and_means(ax, sub, "facts", "first_fail_facts", color, architecture)
    ok = rows[rows["facts"] > 0]
    if len(ok):
        grid = np.geomspace(ok["parameters"].min() * 0.8, ok["parameters"].max() * 1.25, 100)
        c = fits["slope"]
        if c is not None:
            lo, hi = c.ci95()
            ax.plot(grid, c.constant * grid, "-", color="tab:red",
                    label=f"fit: facts = {c.constant:.3f} P  (95% {lo:.3f}-{hi:.3f})")
            ax.fill_between(grid, lo * grid, hi * grid, color="tab:red", alpha=0.1, lw=0)
        ax.plot(grid, 0.15 * grid, "--", color="gray", label="paper: facts = 0.15 P")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if len(ok):
        ticks = [
            2**k
            for k in range(
                int(np.floor(np.log2(ok["parameters"].min()))),
                int(np.ceil(np.log2(ok["parameters"].max()))) + 1,
            )
        ]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("trainable parameters P = 4 H d_h d + 2 m d")
    ax.set_ylabel("facts stored (S R at 99%)")
    seeds = ",".join(map(str, fits["seeds"]))
    ax.set_title(
        f"factual recall: facts against parameters, seeds {seeds}\n{fits['points']} rows fitted, left out: "
        f"{fits['step_limited']} step-limited, {fits['censored']} never failed",
        fontsize=9,
    )
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3, which="both")
    return save(fig, path)


def plot_budget(rows: pd.DataFrame, path: str | Path) -> Path:
    """Facts per parameter against the step budget (log scale), one panel per architecture: every seed,
    the mean, the fitted saturating curve with its ceiling, and the paper's 0.15."""
    kinds = sorted(rows["architecture"].unique())
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.2), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds):
        sub = rows[rows["architecture"] == kind]
        done = sub["converged"].astype(bool)
        ax.scatter(sub.loc[done, "budget"], sub.loc[done, "facts_per_parameter"], s=18, color="tab:blue",
                   alpha=0.7, label="seed, converged")
        ax.scatter(sub.loc[~done, "budget"], sub.loc[~done, "facts_per_parameter"], s=18, facecolors="none",
                   edgecolors="tab:blue", alpha=0.7, label="seed, next table still improving")
        mean = sub.groupby("budget")["facts_per_parameter"].mean()
        ax.plot(mean.index, mean.values, "-", color="tab:blue", alpha=0.5)
        fit = budget_fit(sub)
        if fit is not None:
            grid = np.geomspace(sub["budget"].min(), 16 * sub["budget"].max(), 100)
            lo, hi = fit.ci95()
            ax.plot(grid, fit.at(grid), "--", color="tab:red",
                    label=f"fit f_inf B/(B+B_half): f_inf = {fit.ceiling:.3f} (95% {lo:.3f}-{hi:.3f})")
            ax.axhspan(lo, hi, color="tab:red", alpha=0.08)
        ax.axhline(0.15, color="gray", ls=":", label="paper: 0.15 facts per parameter")
        ax.set_xscale("log", base=2)
        first = sub.iloc[0]
        ax.set_title(f"{kind}, d={first['d']}, H={first['heads']}, P={first['parameters']}", fontsize=10)
        ax.set_xlabel(f"step budget B (batch {first['batch_size']})")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("facts per parameter (S R at 99%)")
    return save(fig, path)


def plot_tradeoff(rows: pd.DataFrame, path: str | Path) -> Path:
    """Heat maps over MLP width m (across) and heads H (down), one cell per (H, m): (a) the accuracy over
    all facts, mean over seeds; (b) the half-width of its 95% Student-t interval over the seeds (left out
    with one seed); (c) the seeds still improving at the step limit (``converged`` False)."""
    cells = tradeoff_cells(rows)
    n = int(cells["seeds"].max())
    first = rows.iloc[0]
    panels = [(cell_grid(cells, "accuracy_mean"), dict(label="accuracy over all facts"),
               f"(a) accuracy over all facts,\nmean over {n} seed{'s' * (n > 1)}", False)]
    if n > 1:
        top = max(float(cells["accuracy_half_width"].max()), 0.01)
        panels.append((cell_grid(cells, "accuracy_half_width"),
                       dict(label="half-width of the 95% interval", vmax=top, cmap="magma", fmt="{:.3f}"),
                       f"(b) half-width of the 95% t interval\nof (a) over the {n} seeds", False))
    if convergence_recorded(rows):
        panels.append(
            (
                cell_grid(cells, "step_limited"),
                dict(label="step-limited seeds", vmax=max(n, 1), cmap="cividis", fmt="{:.0f}"),
                f"({'abc'[len(panels)]}) seeds still improving at the\n"
                f"step limit ({first['steps']} steps), of {n}",
                True,
            )
        )
    width = max(0.5 * cells["width"].nunique() + 1.8, 4.5)
    height = max(0.42 * cells["heads"].nunique() + 1.8, 3.5)
    fig, axes = plt.subplots(1, len(panels), figsize=(len(panels) * width, height), squeeze=False)
    for ax, (grid, style, title, count) in zip(axes[0], panels):
        bar = heatmap(ax, grid, fontsize=6, **style)
        if count:  # seeds: whole ticks
            bar.set_ticks(range(n + 1))
        ax.set_xlabel("MLP width m")
        ax.set_ylabel("heads H")
        ax.set_title(title, fontsize=9)
    fig.suptitle(
        f"attention versus MLP: S={first['subjects']}, R={first['relations']} ({first['facts']} facts), "
        f"d={first['d']}, d_h={first['head_dim']}, <= {first['steps']} steps",
        fontsize=10,
    )
    return save(fig, path)


def plot_dynamics(
    curves: pd.DataFrame, stages: pd.DataFrame, path: str | Path, *, seed: int | None = None
) -> Path:
    """Total, relation-only and subject-only losses of one seed, stages shaded, ln(R D) and ln D marked."""
    seed = int(stages["seed"].iloc[0]) if seed is None else seed
    c = curves[curves["seed"] == seed].sort_values("step")
    st = stages[stages["seed"] == seed].iloc[0]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(c["step"], c["loss"], color="black", label="total loss")
    ax.plot(c["step"], c["relation_loss"], color="tab:blue", label="relation-only loss")
    ax.plot(c["step"], c["subject_loss"], color="tab:orange", label="subject-only loss")
    end = float(c["step"].max())
    spans = [
        (0, st["uniform_end"], "tab:gray", "uniform"),
        (st["hallucination_start"], st["hallucination_end"], "tab:red", "hallucination"),
        (st["converged_at"], end, "tab:green", "converged"),
    ]
    for start, stop, color, label in spans:
        if _present(start) and _present(stop):
            ax.axvspan(float(start), float(stop), color=color, alpha=0.12, label=f"{label} (detected)")
    ax.axhline(st["uniform_level"], ls="--", lw=0.8, color="gray")
    ax.axhline(st["hallucination_level"], ls="--", lw=0.8, color="tab:red")
    for level in (st["uniform_level"], st["hallucination_level"]):
        ax.text(0.5 * end, level + 0.04, f"ln {round(math.exp(level))}", va="bottom", ha="center", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("loss over all facts (nats)")
    ax.set_title(f"linear attention, one-hot embeddings (seed {seed})")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    ax.set_xlim(0, end)
    return save(fig, path)


def _present(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))
