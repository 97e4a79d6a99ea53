"""Plots of the memorization room (PNG, Agg backend): Figure 2 style sweeps, certificates, saturation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from auditor.errors import AuditError
from auditor.lab.figures import plt, save

X_LABELS = {"heads": "heads H", "context": "context length n", "d_h": "key/query width d_h"}
UNSATURATED = 0.95  # points with mean accuracy below this enter the linear fit (our reading of "non-saturated")


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


def sweep_summary(frame: pd.DataFrame, x: str) -> pd.DataFrame:
    """Mean and std over seeds of memorized, certified and accuracy, per (N, x); with the bound."""
    if x not in X_LABELS:
        raise AuditError(f"x must be one of {', '.join(X_LABELS)}, got {x!r}")
    agg = {"memorized": ["mean", "std"], "accuracy": "mean", "bound": "mean", "seed": "count"}
    if "certified" in frame and frame["certified"].notna().any():
        agg["certified"] = ["mean", "std"]
    out = frame.groupby(["N", x]).agg(agg)
    out.columns = ["_".join(c).rstrip("_") for c in out.columns.to_flat_index()]
    return out.rename(columns={"seed_count": "seeds", "accuracy_mean": "accuracy", "bound_mean": "bound"}).reset_index()


def sweep_fits(frame: pd.DataFrame, x: str) -> pd.DataFrame:
    """For ``x = heads``: per N, the line through its unsaturated points (mean accuracy < 0.95) with its
    R^2 (columns N, slope, intercept, r2, points); an empty frame for other axes."""
    if x != "heads":
        return pd.DataFrame()
    fits = []
    for N, part in sweep_summary(frame, x).groupby("N"):
        keep = part[part["accuracy"] < UNSATURATED]
        fits.append({"N": N, **linear_fit(keep[x], keep["memorized_mean"]).__dict__})
    return pd.DataFrame(fits)


def plot_sweep(frame: pd.DataFrame, x: str, path: str | Path, title: str = "") -> pd.DataFrame:
    """Memorized examples against ``x`` (one line per N, mean +- std over seeds), the bound drawn; for
    ``x = heads`` the fit of :func:`sweep_fits` dotted, its R^2 in the legend. Returns the fits."""
    summary = sweep_summary(frame, x)
    fits = sweep_fits(frame, x)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    colors = plt.cm.viridis(np.linspace(0.1, 0.85, max(summary["N"].nunique(), 1)))
    for color, (N, part) in zip(colors, summary.groupby("N")):
        part = part.sort_values(x)
        label = f"N = {N}"
        fit = fits[fits["N"] == N].iloc[0] if len(fits) else None
        if fit is not None and fit["points"] >= 2:
            xs = part.loc[part["accuracy"] < UNSATURATED, x].to_numpy()
            ax.plot(xs, fit["slope"] * xs + fit["intercept"], ":", color=color, lw=1)
            label += f" (fit R$^2$ = {fit['r2']:.3f})"
        ax.errorbar(part[x], part["memorized_mean"], yerr=part["memorized_std"].fillna(0), marker="o", ms=4,
                    color=color, capsize=2, label=label)
        if "certified_mean" in part:
            ax.plot(part[x], part["certified_mean"], "x--", color=color, alpha=0.6, lw=0.8)
        ax.axhline(N, color=color, lw=0.5, alpha=0.4)
    bound = summary.groupby(x)["bound"].mean().sort_index()
    ax.plot(bound.index, bound.to_numpy(), "k-", lw=1.5, label="bound H(min(n, d_h)-1)+1")
    if "certified_mean" in summary:
        ax.plot([], [], "kx--", alpha=0.6, lw=0.8, label="certified (trained attention, LS readout)")
    ax.set_xlabel(X_LABELS[x])
    ax.set_ylabel("examples memorized")
    ax.set_title(title or f"memorization against {X_LABELS[x]}")
    save(fig, path, ax=ax)
    return fits


def plot_tolerance(curves: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Numerical rank of Z against rtol (log axis), one line per ``label``.

    Optional columns: ``bound`` (drawn dotted per label, e.g. H(n-1)+1) and ``default_rtol`` (marked).
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, part in curves.groupby("label", sort=False):
        line = ax.plot(part["rtol"], part["rank"], marker=".", label=str(label))[0]
        if "bound" in part and part["bound"].notna().any():
            ax.axhline(float(part["bound"].iloc[0]), color=line.get_color(), ls=":", lw=1)
    if "default_rtol" in curves:
        ax.axvline(float(curves["default_rtol"].iloc[0]), color="gray", ls="--", lw=1, label="default (float32) rtol")
    ax.set_xscale("log")
    ax.set_xlabel("relative tolerance rtol (singular values > rtol * sigma_max count)")
    ax.set_ylabel("numerical rank of Z")
    ax.set_title(title or "rank of Z against tolerance (dotted: H(n-1)+1)")
    save(fig, path, ax=ax)


def plot_rank_vs_examples(frame: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """rank(Z) against N for each ``label`` (columns N, rank, label, bound), with y = N and the bounds."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, part in frame.groupby("label", sort=False):
        part = part.sort_values("N")
        line = ax.plot(part["N"], part["rank"], marker="o", ms=3, label=str(label))[0]
        if part["bound"].notna().any():
            ax.axhline(float(part["bound"].iloc[0]), color=line.get_color(), ls=":", lw=1)
    top = frame["N"].max()
    ax.plot([0, top], [0, top], color="gray", lw=0.8, label="rank = N")
    ax.set_xlabel("examples N")
    ax.set_ylabel("numerical rank of Z (default tolerance)")
    ax.set_title(title or "rank of Z against N (dotted: H(n-1)+1)")
    save(fig, path, ax=ax)


def plot_saturation(records: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """One member's saturation records (``kind``, ``index``, ``value`` as written by ``fit_bucket``).

    Left: examples by number of saturated heads; right: saturated share per head.
    """
    hist = records[records["kind"] == "histogram"].rename(columns={"index": "saturated_heads", "value": "examples"})
    per_head = records[records["kind"] == "head"].rename(columns={"index": "head", "value": "saturated_fraction"})
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
