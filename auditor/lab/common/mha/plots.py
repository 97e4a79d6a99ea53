"""Figures of multi-head attention memorization (PNG, Agg backend): Figure 2 style sweeps (``audit memorize``,
``audit capacity``) and the softmax saturation of one member."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from auditor.core.errors import AuditError
from auditor.lab.figures import plt, save
from auditor.lab.stats import is_true, mean_ci

X_LABELS = {"heads": "heads H", "context": "context length n", "d_h": "key/query width d_h"}
UNSATURATED = (
    0.95  # points with mean accuracy below this enter the linear fit (our reading of "non-saturated")
)


@dataclass(frozen=True)
class LinearFit:
    """Least-squares line y = slope x + intercept and its coefficient of determination."""

    slope: float
    intercept: float
    r2: float
    points: int


def linear_fit(x: np.ndarray, y: np.ndarray) -> LinearFit:
    """Fit a line; R^2 = 1 - SS_res / SS_tot (nan with fewer than 3 points or constant y)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2:
        return LinearFit(float("nan"), float("nan"), float("nan"), int(x.size))
    slope, intercept = np.polyfit(x, y, 1)
    ss_res = float(((y - (slope * x + intercept)) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 and x.size >= 3 else float("nan")
    return LinearFit(float(slope), float(intercept), r2, int(x.size))


def converged_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows whose training converged (all of them for CSVs written before ``converged`` existed)."""
    if "converged" not in frame:
        return frame
    return frame[frame["converged"].map(is_true)]


def sweep_summary(frame: pd.DataFrame, x: str) -> pd.DataFrame:
    """Per (N, x), over the converged seeds: memorized mean with its 95% t interval (``memorized_low``,
    ``memorized_high``), mean accuracy, guaranteed and readout_hits means, the lower bound, ``seeds``
    (converged) and ``runs`` (all, step-limited ones included)."""
    if x not in X_LABELS:
        raise AuditError(f"x must be one of {', '.join(X_LABELS)}, got {x!r}")
    rows = []
    for (N, value), part in frame.groupby(["N", x]):
        done = converged_rows(part)
        mean, low, high = mean_ci(done["memorized"])
        row = {"N": N, x: value, "memorized_mean": mean, "memorized_low": low, "memorized_high": high,
               "accuracy": float(done["accuracy"].mean()) if len(done) else float("nan"),
               "lower_bound": float(part["lower_bound"].mean()) if "lower_bound" in part else float("nan"),
               "seeds": len(done), "runs": len(part)}
        for name in ("guaranteed", "readout_hits"):
            if name in part and part[name].notna().any():
                row[f"{name}_mean"] = float(done[name].mean()) if len(done) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def sweep_fits(frame: pd.DataFrame, x: str) -> pd.DataFrame:
    """For ``x = heads``: per N, a line through the unsaturated points (mean accuracy < 0.95) fitted to each
    seed's converged runs, then the slope's mean and 95% t interval over seeds (columns N, slope, slope_low,
    slope_high, intercept, r2 = mean over seeds, points, seeds); an empty frame for other axes."""
    if x != "heads":
        return pd.DataFrame()
    summary = sweep_summary(frame, x)
    fits = []
    for N, part in converged_rows(frame).groupby("N"):
        chosen = summary[(summary["N"] == N) & (summary["accuracy"] < UNSATURATED)][x]
        per_seed = [
            linear_fit(runs[x], runs["memorized"]) for _, runs in part[part[x].isin(chosen)].groupby("seed")
        ]
        per_seed = [f for f in per_seed if f.points >= 2]
        slope, low, high = mean_ci([f.slope for f in per_seed])
        fits.append(
            {
                "N": N,
                "slope": slope,
                "slope_low": low,
                "slope_high": high,
                "intercept": mean_ci([f.intercept for f in per_seed])[0],
                "r2": mean_ci([f.r2 for f in per_seed])[0],
                "points": len(chosen),
                "seeds": len(per_seed),
            }
        )
    return pd.DataFrame(fits)


def plot_sweep(frame: pd.DataFrame, x: str, path: str | Path, title: str = "") -> pd.DataFrame:
    """Memorized examples against ``x`` (one line per N: mean over converged seeds with 95% t-interval
    error bars), the lower bound drawn; for ``x = heads`` the fit of :func:`sweep_fits` dotted with its
    slope interval and R^2 in the legend. Runs stopped at the step limit are left out and counted in the
    title. Returns the fits."""
    summary = sweep_summary(frame, x)
    fits = sweep_fits(frame, x)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, max(summary["N"].nunique(), 1)))
    for color, (N, part) in zip(colors, summary.groupby("N")):
        part = part.sort_values(x)
        label = f"N = {N}"
        fit = fits[fits["N"] == N].iloc[0] if len(fits) else None
        if fit is not None and np.isfinite(fit["slope"]):
            xs = part.loc[part["accuracy"] < UNSATURATED, x].to_numpy()
            ax.plot(xs, fit["slope"] * xs + fit["intercept"], ":", color=color, lw=1)
            label += (
                f" (slope {fit['slope']:.0f} [{fit['slope_low']:.0f}, {fit['slope_high']:.0f}], "
                f"R$^2$ = {fit['r2']:.3f})"
            )
        errors = np.vstack(
            [part["memorized_mean"] - part["memorized_low"], part["memorized_high"] - part["memorized_mean"]]
        )
        ax.errorbar(
            part[x],
            part["memorized_mean"],
            yerr=np.nan_to_num(errors),
            marker="o",
            ms=4,
            color=color,
            capsize=2,
            label=label,
        )
        if "readout_hits_mean" in part:
            ax.plot(part[x], part["readout_hits_mean"], "x--", color=color, alpha=0.6, lw=0.8)
        if "guaranteed_mean" in part:
            ax.plot(part[x], part["guaranteed_mean"], "s:", color=color, alpha=0.6, lw=0.8, ms=3)
        ax.axhline(N, color=color, lw=0.5, alpha=0.4)
    bound = summary.groupby(x)["lower_bound"].mean().sort_index()
    ax.plot(
        bound.index, bound.to_numpy(), "k-", lw=1.5, label="lower bound H(min(n, d_h)-1)+1 (best weights)"
    )
    if "readout_hits_mean" in summary:
        ax.plot([], [], "kx--", alpha=0.6, lw=0.8, label="readout hits (argmax of the LS readout)")
    if "guaranteed_mean" in summary:
        ax.plot([], [], "ks:", alpha=0.6, lw=0.8, ms=3, label="guaranteed = min(rank Z, N)")
    dropped = int((summary["runs"] - summary["seeds"]).sum())
    ax.set_xlabel(X_LABELS[x])
    ax.set_ylabel("examples memorized (mean, 95% t interval over seeds)")
    ax.set_title((title or f"memorization against {X_LABELS[x]}")
                 + (f"\n{dropped} run(s) stopped at the step limit left out" if dropped else ""), fontsize=10)
    save(fig, path, ax=ax)
    return fits


def plot_saturation(records: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """One member's saturation records (``kind``, ``index``, ``value`` as written by ``fit_bucket``).

    Left: examples by number of saturated heads; right: saturated share per head.
    """
    hist = records[records["kind"] == "histogram"].rename(
        columns={"index": "saturated_heads", "value": "examples"}
    )
    per_head = records[records["kind"] == "head"].rename(
        columns={"index": "head", "value": "saturated_fraction"}
    )
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.8))
    left.bar(hist["saturated_heads"], hist["examples"], color="tab:blue")
    left.set_xlabel("saturated heads (max attention > threshold)")
    left.set_ylabel("examples")
    right.bar(per_head["head"], per_head["saturated_fraction"], color="tab:orange")
    right.set_xlabel("head")
    right.set_ylabel("share of examples saturated")
    right.set_ylim(0, 1)
    fig.suptitle(title or "softmax saturation")
    save(fig, path)
