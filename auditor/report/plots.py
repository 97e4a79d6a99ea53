"""Plots of an audit: Kruskal curves (with n and d marked), per-context ranks and margins.

Each plot function draws one figure; :func:`write_plots` saves them as PNGs through a
:class:`~auditor.atomic.Staged` writer, so a failed save (full disk) leaves no empty or partial PNG.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from auditor.config import RTOL_RULE  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from auditor.atomic import Staged
    from auditor.report.result import AuditResult

PLOT_FILES = ("kruskal_curve.png", "context_ranks.png", "margins.png")


def write_plots(result: AuditResult, out: Path, staged: Staged) -> list[Path]:
    """Stage the PNGs that apply to ``result`` in ``out`` (renamed into place by ``staged.commit()``);
    return their final paths."""
    plots: list[tuple[str, Callable[[AuditResult], Figure]]] = []
    if not result.curves.empty:
        plots.append(("kruskal_curve.png", kruskal_curve))
    if result.context_ranks:
        plots += [("context_ranks.png", context_rank_histogram), ("margins.png", margin_histogram)]
    paths = []
    for name, draw in plots:
        fig = draw(result)
        try:
            paths.append(staged.write(out / name, lambda tmp, fig=fig: fig.savefig(tmp, dpi=130, format="png")))
        finally:
            plt.close(fig)
    return paths


def kruskal_curve(result: AuditResult) -> Figure:
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
           title=f"{result.config.model}: Kruskal rank of the query tokens{per_k}\n{_rtol(result)}")
    return _finish(fig, ax)


def context_rank_histogram(result: AuditResult) -> Figure:
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
    ax.set(xlabel=f"rank of the context matrix\n(singular values > rtol x sigma_max; {_rtol(result)})",
           ylabel="examples",
           title=f"{result.config.model}: per-example context rank (Assumption 2)")
    return _finish(fig, ax)


def margin_histogram(result: AuditResult) -> Figure:
    """Distribution of context-rank margins in decades (how far each verdict is from flipping)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, margins in result.margins.items():
        values = margins.numpy()
        values = values[values < float("inf")]
        if values.size:
            ax.hist(values, bins=30, alpha=0.6, label=label.replace("@", " @ "))
    ax.set(xlabel=f"margin: decades between the deciding singular value and rtol x sigma_max\n({_rtol(result)})",
           ylabel="examples", title=f"{result.config.model}: context-rank margins (2 = certified lower bound)")
    return _finish(fig, ax)


def _rtol(result: AuditResult) -> str:
    """``rtol = 1e-06``, or the default rule when none was given."""
    return f"rtol = {RTOL_RULE}" if result.config.rtol is None else f"rtol = {result.config.rtol:g}"


def _finish(fig: Figure, ax) -> Figure:
    """Legend and layout (the caller saves and closes the figure)."""
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
