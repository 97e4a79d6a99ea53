"""Plots of an audit: Kruskal curves (with n and d marked), per-context ranks and margins."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

if TYPE_CHECKING:
    from auditor.runner import AuditResult


def write_plots(result: AuditResult, out: Path) -> list[Path]:
    """Write the PNGs that apply to ``result`` into ``out``; return their paths."""
    paths = []
    if not result.curves.empty:
        paths.append(kruskal_curve(result, out / "kruskal_curve.png"))
    if result.context_ranks:
        paths.append(context_rank_histogram(result, out / "context_ranks.png"))
        paths.append(margin_histogram(result, out / "margins.png"))
    return paths


def kruskal_curve(result: AuditResult, path: Path) -> Path:
    """Full-rank fraction of k-subsets of the queries against k, one line per representation."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    curves = result.curves
    for (rep, weights), frame in curves.groupby(["representation", "weights"], sort=False):
        ax.plot(frame["k"], frame["fraction"], marker="o", ms=3, label=f"{rep} @ {weights}")
    n, d = int(curves["n"].iloc[0]), int(curves["d"].iloc[0])
    ax.axvline(n, color="grey", ls="--", lw=1, label=f"n = {n} (Assumption 1)")
    ax.axvline(d, color="grey", ls=":", lw=1, label=f"d = {d} (general position)")
    subsets = int(curves["subsets"].max()) if "subsets" in curves else None
    per_k = f", {subsets} random subsets per k" if subsets else ""
    ax.set(xlabel="subset size k", ylabel="share of full-rank k-subsets", ylim=(-0.03, 1.03),
           title=f"{result.config.model}: Kruskal rank of the query tokens{per_k}")
    return _save(fig, ax, path)


def context_rank_histogram(result: AuditResult, path: Path) -> Path:
    """Histogram of per-context ranks (Assumption 2 asks for every rank to equal n)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, ranks in result.context_ranks.items():
        values = ranks.numpy()
        lo, hi = values.min(), values.max()
        bins = max(1, int(hi - lo) + 1)
        ax.hist(values, bins=bins, range=(lo - 0.5, hi + 0.5), alpha=0.6, label=label.replace("@", " @ "))
    n = int(result.rows["n"].dropna().iloc[0]) if result.rows["n"].notna().any() else None
    if n is not None:
        ax.axvline(n, color="black", ls="--", lw=1, label=f"n = {n}")
    ax.set(xlabel="rank of the context matrix", ylabel="examples",
           title=f"{result.config.model}: per-example context rank (Assumption 2)")
    return _save(fig, ax, path)


def margin_histogram(result: AuditResult, path: Path) -> Path:
    """Distribution of context-rank margins in decades (how far each verdict is from flipping)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, margins in result.margins.items():
        values = margins.numpy()
        values = values[values < float("inf")]
        if values.size:
            ax.hist(values, bins=30, alpha=0.6, label=label.replace("@", " @ "))
    ax.set(xlabel="margin (decades between the deciding singular value and the tolerance)",
           ylabel="examples", title=f"{result.config.model}: context-rank margins (2 = certified lower bound)")
    return _save(fig, ax, path)


def _save(fig, ax, path: Path) -> Path:
    """Legend, layout, PNG at 130 dpi, and release the figure."""
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
