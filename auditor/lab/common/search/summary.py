"""Fits and Markdown summaries of the capacity-lab-III results (what the report and the CLI print).

Points whose search never failed (the capacity reached the search's upper end, so it is only a lower
bound) are left out of every fit and counted as ``censored``; so are points whose first failing probe
(memory) or table (factual recall) was still improving when its step budget ran out (``converged``
False: the budget, not the model, set the capacity), counted as ``step_limited``. A CSV written before
the ``converged`` column existed has its uncensored rows fitted as before (convergence not recorded).
Every per-size capacity is given as the mean over converged seeds with a 95% Student-t interval over
those seeds. With several step budgets the facts-per-parameter fit uses the largest, and
:func:`budget_fit` fits the saturating curve facts/P = f_inf B / (B + B_half) over the budgets B.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from auditor.lab.common.search.capacity import (
    FACTS_PER_PARAMETER_GUIDE,
    GUIDE_CONSTANT,
    LM_BITS_PER_PARAMETER,
    ConstantFit,
    PowerLawFit,
    fit_guide_constant,
    fit_power_law,
    n_log_n,
)
from auditor.lab.common.search.convergence import PLATEAU_GAIN, PLATEAU_WINDOW
from auditor.lab.stats import is_true, mean_ci


def _uncensored(rows: pd.DataFrame, value: str, fail: str) -> pd.DataFrame:
    """Rows whose search failed somewhere (``fail`` column set) and whose ``value`` is above 1."""
    return rows[rows[fail].notna() & (rows[value] > 1)]


def converged_mask(rows: pd.DataFrame) -> pd.Series:
    """Per row: converged (True) or step-limited / unbracketed (False). All True when the CSV predates the
    ``converged`` column (convergence not recorded: see :func:`convergence_recorded`)."""
    if "converged" not in rows:
        return pd.Series(True, index=rows.index)
    return rows["converged"].map(is_true).astype(bool)


def convergence_recorded(rows: pd.DataFrame) -> bool:
    return "converged" in rows


def seed_interval(values: Any) -> tuple[float, float]:
    """95% Student-t interval of the mean over seeds (NaN with fewer than 2 values; a point when all
    agree)."""
    return mean_ci(values)[1:]


def _split(rows: pd.DataFrame, value: str, fail: str) -> tuple[pd.DataFrame, int, int]:
    """(rows fitted: uncensored and converged, censored count, step-limited count)."""
    uncensored = _uncensored(rows, value, fail)
    fitted = uncensored[converged_mask(uncensored)]
    return fitted, len(rows) - len(uncensored), len(uncensored) - len(fitted)


def capacity_fits(rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per memory kind: ``power`` (N = k P^b), ``law`` (P = c (N ln N)^b, b = 1 under the paper's law),
    ``constant`` (c of P = c N ln N) and the paper's ``guide`` c, over the converged, uncensored rows
    (``points``); ``censored`` (the search never failed, or capacity <= 1) and ``step_limited`` (the first
    failing probe was still improving at the step limit) count the rows left out (``left_out``). Fits need
    >= 3 points (else None)."""
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted(set(rows["kind"])):
        sub, censored, step_limited = _split(rows[rows["kind"] == kind], "capacity", "first_fail")
        enough = len(sub) >= 3 and sub["parameters"].nunique() >= 2
        out[kind] = {
            "power": fit_power_law(sub["parameters"], sub["capacity"]) if enough else None,
            "law": fit_power_law(n_log_n(sub["capacity"]), sub["parameters"]) if enough else None,
            "constant": fit_guide_constant(sub["parameters"], n_log_n(sub["capacity"])) if len(sub) else None,
            "guide": GUIDE_CONSTANT[kind],
            "points": len(sub),
            "censored": censored,
            "step_limited": step_limited,
            "left_out": censored + step_limited,
            "seeds": sorted(int(s) for s in rows.loc[rows["kind"] == kind, "seed"].unique())
            if "seed" in rows
            else [],
        }
    return out


def final_budget(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of the largest step budget (all rows when there is no ``budget`` column)."""
    return rows[rows["budget"] == rows["budget"].max()] if "budget" in rows and len(rows) else rows


def facts_fits(rows: pd.DataFrame) -> dict[str, Any]:
    """``slope`` (facts = c P), ``power`` (facts = k P^b), bits per parameter, over every uncensored and
    converged row of the largest budget (``points``); ``censored`` and ``step_limited`` count the rows left
    out (``left_out``), as in :func:`capacity_fits`."""
    rows = final_budget(rows)
    sub, censored, step_limited = _split(rows, "facts", "first_fail_facts")
    enough = len(sub) >= 3 and sub["parameters"].nunique() >= 2
    slope = fit_guide_constant(sub["facts"], sub["parameters"]) if len(sub) else None
    bits_per_fact = float(np.log2(rows["answers_per_relation"].iloc[0])) if len(rows) else float("nan")
    return {
        "slope": slope,
        "power": fit_power_law(sub["parameters"], sub["facts"]) if enough else None,
        "bits_per_parameter": slope.constant * bits_per_fact if slope else None,
        "bits_per_fact": bits_per_fact,
        "points": len(sub),
        "censored": censored,
        "step_limited": step_limited,
        "left_out": censored + step_limited,
        "seeds": sorted(int(x) for x in rows["seed"].unique()) if "seed" in rows else [],
    }


def _fmt_power(p: PowerLawFit | None) -> str:
    if p is None:
        return "n/a"
    lo, hi = p.ci95()
    return f"{p.exponent:.3f} ± {p.exponent_se:.3f} (95% {lo:.3f} to {hi:.3f}), R² {p.r2:.3f}"


def _fmt_const(c: ConstantFit | None) -> str:
    if c is None:
        return "n/a"
    lo, hi = c.ci95()
    return f"{c.constant:.3f} (95% {lo:.3f} to {hi:.3f}, n = {c.n})"


def _per_size(rows: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Per size: seeds, converged k/n, and ``value`` over the converged seeds (mean, 95% interval, min, max),
    with the mean over all seeds beside it."""
    done = converged_mask(rows)
    out = []
    for key, part in rows.groupby(keys, sort=True):
        ok = part.loc[done.loc[part.index], value].astype(float)
        lo, hi = seed_interval(ok)
        out.append({**dict(zip(keys, key)), "seeds": len(part), "converged": f"{len(ok)}/{len(part)}",
                    f"{value} mean": ok.mean() if len(ok) else math.nan,
                    "95% over seeds": f"{lo:.4g} to {hi:.4g}" if len(ok) > 1 else "n/a",
                    "min": ok.min() if len(ok) else math.nan, "max": ok.max() if len(ok) else math.nan,
                    "mean, all seeds": part[value].astype(float).mean()})
    return pd.DataFrame(out)


def _criterion(rows: pd.DataFrame) -> str:
    if not convergence_recorded(rows):
        return ("- convergence not recorded in these rows (written before the `converged` column): every "
                "uncensored row is fitted")
    return (
        "- `converged`: the capacity's first failing probe had plateaued (accuracy rose by less than "
        f"{PLATEAU_GAIN:g} over the last {PLATEAU_WINDOW:.0%} of its step budget); probes that pass reached "
        "the threshold. Means, intervals, min and max are over converged seeds; fits use converged rows only."
    )


def capacity_markdown(rows: pd.DataFrame) -> str:
    """Capacity per size (mean, 95% interval, range over converged seeds) and the fits against the
    paper's guides, with the rows each fit left out."""
    table = _per_size(rows, ["kind", "d", "width", "parameters"], "capacity")
    table["parameters / (N ln N)"] = table["parameters"] / n_log_n(table["capacity mean"].clip(lower=2))
    lines = [table.to_markdown(index=False, floatfmt=".4g"), "", _criterion(rows), ""]
    lines += ["| memory | seeds | paper's c in P = c N ln N | fitted c | exponent b in P ∝ (N ln N)^b | "
              "exponent in N ∝ P^b | rows fitted | left out: never failed / step-limited |",
              "|---|---|---|---|---|---|---|---|"]
    for kind, fit in capacity_fits(rows).items():
        lines.append(
            f"| {kind} | {','.join(map(str, fit['seeds']))} | {fit['guide']} | {_fmt_const(fit['constant'])} "
            f"| {_fmt_power(fit['law'])} | {_fmt_power(fit['power'])} | {fit['points']} | "
            f"{fit['censored']} / {fit['step_limited']} |"
        )
    return "\n".join(lines)


def facts_markdown(rows: pd.DataFrame) -> str:
    """Facts-per-parameter table (mean, 95% interval over converged seeds) and fit (largest budget),
    compared with 0.15 facts and 2 bits per parameter."""
    rows = final_budget(rows)
    keys = ["architecture", "d", "heads", "head_dim", "width", "parameters"]
    table = _per_size(rows, keys, "facts_per_parameter").rename(columns={"min": "fpp min", "max": "fpp max"})
    facts = (
        rows[converged_mask(rows)]
        .groupby(keys)["facts"]
        .mean()
        .rename("facts mean (converged)")
        .reset_index()
    )
    table = table.merge(facts, on=keys, how="left")
    fit = facts_fits(rows)
    slope = fit["slope"]
    lines = [
        table.to_markdown(index=False, floatfmt=".4g"),
        "",
        _criterion(rows).replace("probe", "table"),
        "",
    ]
    lines.append(
        f"- fitted facts per parameter: {_fmt_const(slope)}; paper's guide {FACTS_PER_PARAMETER_GUIDE}; "
        f"seeds {','.join(map(str, fit['seeds']))}"
    )
    if fit["bits_per_parameter"] is not None:
        lo, hi = slope.ci95()
        per_fact = fit["bits_per_fact"]
        lines.append(
            f"- facts x log2 D per parameter: {fit['bits_per_parameter']:.3f} (95% {lo * per_fact:.3f} to "
            f"{hi * per_fact:.3f}; log2 D = {per_fact:.0f} bits per fact, the bits a perfectly recalled "
            "table holds; `audit bits` counts each row's entropy less the code correcting its missed facts); "
            f"paper's guide {FACTS_PER_PARAMETER_GUIDE * per_fact:.2f}; real language models "
            f"~{LM_BITS_PER_PARAMETER:g}"
        )
    lines.append(f"- exponent of facts ∝ P^b: {_fmt_power(fit['power'])} (1 = linear)")
    lines.append(
        f"- rows fitted: {fit['points']} of {len(rows)}; left out: {fit['censored']} whose search never "
        f"failed, {fit['step_limited']} step-limited"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class BudgetFit:
    """facts per parameter = ``ceiling`` B / (B + ``half_budget``), fitted over step budgets B."""

    ceiling: float
    ceiling_se: float
    half_budget: float
    n: int

    def ci95(self) -> tuple[float, float]:
        """95% interval of the ceiling (t with n - 2 degrees of freedom on the fit's standard error)."""
        t = stats.t.ppf(0.975, self.n - 2) if self.n > 2 else float("inf")
        return self.ceiling - t * self.ceiling_se, self.ceiling + t * self.ceiling_se

    def at(self, budget: float | np.ndarray) -> float | np.ndarray:
        return self.ceiling * budget / (budget + self.half_budget)

    def budget_for(self, target: float) -> float:
        """Steps the curve needs to reach ``target`` facts per parameter (inf if never)."""
        return self.half_budget * target / (self.ceiling - target) if self.ceiling > target else math.inf


def budget_fit(rows: pd.DataFrame) -> BudgetFit | None:
    """Least-squares fit of the saturating curve over every (seed, budget) point with facts > 0; None
    with fewer than 3 points or 2 budgets, or when the fit does not converge."""
    sub = rows[rows["facts"] > 0]
    if len(sub) < 3 or sub["budget"].nunique() < 2:
        return None
    b, f = sub["budget"].to_numpy(float), sub["facts_per_parameter"].to_numpy(float)
    try:
        (ceiling, half), cov = optimize.curve_fit(lambda x, c, h: c * x / (x + h), b, f,
                                                  p0=(f.max(), float(np.median(b))), bounds=(0, np.inf))
    except (RuntimeError, ValueError):
        return None
    return BudgetFit(float(ceiling), float(np.sqrt(cov[0, 0])), float(half), len(sub))


def budget_markdown(rows: pd.DataFrame) -> str:
    """Facts per parameter against the step budget, per architecture: mean, 95% interval over seeds,
    converged runs, and the saturating fit with its ceiling."""
    def ci(x: pd.Series) -> str:
        if len(x) < 2:
            return "n/a"
        lo, hi = seed_interval(x)
        return f"{lo:.3f} to {hi:.3f}"

    table = (
        rows.groupby(["architecture", "parameters", "budget"])
        .agg(
            facts=("facts", "mean"),
            facts_per_parameter=("facts_per_parameter", "mean"),
            interval=("facts_per_parameter", ci),
            converged=("converged", lambda c: f"{int(c.sum())}/{len(c)}"),
        )
        .reset_index()
        .rename(columns={"interval": "95% over seeds"})
    )
    lines = [table.to_markdown(index=False, floatfmt=".4g"), ""]
    for architecture, sub in rows.groupby("architecture"):
        fit = budget_fit(sub)
        if fit is None:
            lines.append(f"- {architecture}: too few points for the saturating fit")
            continue
        lo, hi = fit.ci95()
        need = fit.budget_for(FACTS_PER_PARAMETER_GUIDE)
        lines.append(
            f"- {architecture}: facts/P = f_inf B / (B + B_half) with "
            f"f_inf = {fit.ceiling:.3f} (95% {lo:.3f} "
            f"to {hi:.3f}), B_half = {fit.half_budget:.0f} steps, n = {fit.n}; reaches "
            f"{FACTS_PER_PARAMETER_GUIDE} at "
            + (f"~{need:.0f} steps" if math.isfinite(need) else "no budget")
        )
    return "\n".join(lines)


def tradeoff_cells(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (H, m) of the trade-off grid, over its seeds: ``accuracy_mean`` with the 95% Student-t
    interval of that mean over the seeds (``accuracy_low``, ``accuracy_high``, and its half-width
    ``accuracy_half_width``; NaN with one seed), ``seeds``, ``stored`` (seeds that store every fact at the
    threshold) and ``step_limited`` (seeds still improving at the step limit, ``converged`` False)."""
    done = converged_mask(rows)
    out = []
    for (heads, width), part in rows.groupby(["heads", "width"]):
        mean, low, high = mean_ci(part["accuracy"])
        out.append(
            {
                "heads": heads,
                "width": width,
                "parameters": int(part["parameters"].iloc[0]),
                "seeds": len(part),
                "accuracy_mean": mean,
                "accuracy_low": low,
                "accuracy_high": high,
                "accuracy_half_width": (high - low) / 2,
                "stored": int(part["stored"].map(is_true).sum()),
                "step_limited": int((~done[part.index]).sum()),
            }
        )
    return pd.DataFrame(out)


def smallest_storing_width(rows: pd.DataFrame) -> pd.DataFrame:
    """Per H (rows) and seed (columns): the smallest MLP width m whose model stores every fact at the
    threshold; NaN where no width of the grid does."""
    ok = rows[rows["stored"].map(is_true)]
    table = ok.groupby(["heads", "seed"])["width"].min().unstack("seed")
    return table.reindex(index=sorted(rows["heads"].unique()), columns=sorted(rows["seed"].unique()))


def cell_grid(cells: pd.DataFrame, value: str) -> pd.DataFrame:
    """One column of :func:`tradeoff_cells` as a table: H down, m across."""
    return cells.pivot(index="heads", columns="width", values=value).sort_index()


def tradeoff_markdown(rows: pd.DataFrame) -> str:
    """The heat map as tables over the seeds (mean accuracy, the half-width of its 95% interval, the seeds
    still improving at the step limit), and per H the smallest MLP width that stores the facts."""
    cells = tradeoff_cells(rows)
    seeds = sorted(rows["seed"].unique())
    n = len(seeds)
    lines = [f"accuracy over all facts, mean over {n} seed{'s' * (n > 1)} ({', '.join(map(str, seeds))}; "
             "rows: H, columns: m)", "", cell_grid(cells, "accuracy_mean").to_markdown(floatfmt=".3f"), ""]
    if n > 1:
        lines += [f"half-width of the 95% Student-t interval of that mean over the {n} seeds (t with {n - 1} "
                  "degrees of freedom; 0: every seed the same)", "",
                  cell_grid(cells, "accuracy_half_width").to_markdown(floatfmt=".3f"), ""]
    if convergence_recorded(rows):
        lines += [
            f"seeds still improving at the step limit (accuracy rose by >= {PLATEAU_GAIN} over the last "
            f"{PLATEAU_WINDOW:.0%} of the steps; `converged` False) of {n}",
            "",
            cell_grid(cells, "step_limited").to_markdown(),
            "",
        ]
    widths = smallest_storing_width(rows)
    every = cells[cells["stored"] == cells["seeds"]].groupby("heads")["width"].min()
    for heads, per_seed in widths.iterrows():
        head = f"- H = {heads}: smallest width storing all facts at the threshold"
        if n == 1:
            found = per_seed.dropna()
            lines.append(
                f"{head}: " + (f"m = {int(found.iloc[0])}" if len(found) else "none of the widths tried")
            )
            continue
        text = ", ".join("none" if pd.isna(w) else f"{int(w)}" for w in per_seed)
        if per_seed.notna().all():
            mean, low, high = mean_ci(per_seed)
            text += f"; mean {mean:.0f}" + ("" if math.isnan(low) else f" [95%: {low:.0f}, {high:.0f}]")
        both = f"m = {int(every[heads])}" if heads in every.index else "none of the widths tried"
        lines.append(f"{head}, per seed ({', '.join(map(str, seeds))}): {text}; in all {n} seeds: {both}")
    if convergence_recorded(rows):
        done = converged_mask(rows)
        per_seed = "; ".join(
            f"seed {s}: {int((~done[rows['seed'] == s]).sum())} of {int((rows['seed'] == s).sum())}"
            for s in seeds
        )
        lines.append(
            f"- cells still improving at the step limit (`converged` False): {int((~done).sum())} of "
            f"{len(rows)} runs ({per_seed})"
        )
    return "\n".join(lines)


def dynamics_markdown(stages: pd.DataFrame) -> str:
    """Stage boundaries per seed as step numbers, with the plateau levels."""
    cols = ["seed", "uniform_end", "hallucination_start", "hallucination_end", "converged_at",
            "uniform_mean", "hallucination_mean", "relation_loss_mid", "hallucination_confirmed"]
    first = stages.iloc[0]
    head = (
        f"plateau levels: ln(R D) = {first['uniform_level']:.3f}, ln D = {first['hallucination_level']:.3f} "
        f"(= ln {round(math.exp(first['hallucination_level']))})"
    )
    return head + "\n\n" + stages[cols].to_markdown(index=False, floatfmt=".4g")
