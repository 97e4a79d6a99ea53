"""Figures of an audit, sized for a paper column (3.5 in wide, >= 7 pt text, 300 dpi).

- ``kruskal_curve.png``: share of full-rank query k-subsets against k (the sweep), a panel per
  representation, n, d and N marked.
- ``context_ranks.png``: how many contexts reached each rank (Assumption 2), grouped bars.
- ``margins.png``: per-context rank margins in decades, exact or a proven lower bound, a panel per
  representation.
- ``rtol_sweep.png``: each test's fraction against a multiple of its rtol, with the critical rtol and its
  proven bracket: a panel per test, or per representation when there are more than
  :data:`MANY_REPRESENTATIONS` (an audit across depth).
- ``depth_kruskal.png``, ``depth_geometry.png``, ``depth_fractions.png``: profiles against depth (from
  ``AuditResult.depth``; only when the audit measured several layers). The Kruskal rank is drawn as the
  interval its bounds prove (certified lower to witnessed upper) with the sampled estimate inside it,
  never as a number where only bounds are known; the geometry raw and mean-centred, a panel each.

Small multiples rather than one crowded axis: at every depth each panel keeps a handful of lines, and
every figure is also written as a vector PDF beside its PNG.

A representation has the same colour in every figure (:mod:`auditor.audit.report.style`); its random and
pretrained versions share it and differ by line style and marker. Each figure function takes the result
(and optionally the palette) and returns a figure; :func:`write_plots` picks those that apply and stages
them through a :class:`~auditor.core.atomic.Staged` writer, so a failed save leaves no partial file. A column
an older report lacks (``margin_bound``, ``rtol_grid``, ``fraction_low``, ...) leaves out what it draws.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from auditor.audit.report.style import (  # noqa: E402
    COLUMN_WIDTH,
    DPI,
    REFERENCE_COLOR,
    STATEMENT_MARKS,
    Palette,
    figure_style,
    finish_panels,
    legend_below,
    legend_rows_height,
    panel_grid,
    representation_order,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from auditor.audit.report.result import AuditResult
    from auditor.core.atomic import Staged

PLOT_FILES = ("kruskal_curve.png", "context_ranks.png", "margins.png", "rtol_sweep.png", "depth_kruskal.png",
              "depth_geometry.png", "depth_fractions.png")
TEST_LABELS = {"assumption1": "Assumption 1 (k = n)", "assumption2": "Assumption 2 (rank n)",
               "assumption3": "Assumption 3 (k = n)", "general_position": "general position"}  # panel titles
GEOMETRY = {  # depth.csv column -> panel title (with its unit)
    "effective_rank": "effective rank (dimensions)",
    "effective_rank_centred": "effective rank, centred",
    "stable_rank": "stable rank ||X||$_F^2$/||X||$_2^2$",
    "stable_rank_centred": "stable rank, centred",
    "anisotropy": "anisotropy (mean cosine)",
    "anisotropy_centred": "anisotropy, centred",
    "collapse_residual": "collapse residual\n||E - 1 mean(E)||$_F$ / ||E||$_F$",
}
NUDGE = 0.05  # rtol_sweep.png: the lines of a panel spread over this much of the fraction axis, so equal
# fractions (every test at 1.0) do not hide one another
SWEEP_MARGIN = 30.0  # rtol_sweep.png shows the grid's multipliers and this factor beyond either end
MANY_REPRESENTATIONS = 4  # above this many representations, rtol_sweep.png draws a panel per representation
TEST_COLORS = {"assumption1": "#1f77b4", "assumption2": "#ff7f0e", "assumption3": "#8c564b",
               "general_position": "#7f7f7f"}  # tests within a representation's panel

TITLE_WIDTH = 52  # characters of a title line at 8 pt in a column
DEPTH_LABEL = "depth (0 = embedding, L + 1 = block.L)"
DEPTH_SHORT = "depth (0 = embedding)"

Draw = Callable[["AuditResult", Palette], "Figure"]


def write_plots(result: AuditResult, out: Path, staged: Staged, *, pdf: bool = True,
                svgs: dict[str, str] | None = None) -> list[Path]:
    """Stage the figures that apply to ``result`` in ``out`` (renamed into place by ``staged.commit()``).

    Each figure is a 300 dpi PNG and (``pdf``, the default) a vector PDF of the same name beside it, for
    a paper. ``svgs``: filled with each figure as inline SVG for report.html, from the same drawing.
    Returns the final paths of the PNGs.
    """
    palette = palette_of(result)
    paths = []
    for name, draw in applicable_plots(result):
        with figure_style():
            fig = draw(result, palette)
        try:
            paths.append(
                staged.write(out / name, lambda tmp, fig=fig: fig.savefig(tmp, dpi=DPI, format="png"))
            )
            if pdf:
                staged.write(
                    (out / name).with_suffix(".pdf"), lambda tmp, fig=fig: fig.savefig(tmp, format="pdf")
                )
            if svgs is not None:
                from auditor.audit.report.html import figure_svg

                svgs[name] = figure_svg(fig, f"f{len(svgs)}")
        finally:
            plt.close(fig)
    return paths


def applicable_plots(result: AuditResult) -> list[tuple[str, Draw]]:
    """``(file name, figure function)`` of every figure ``result`` has the data for."""
    plots: list[tuple[str, Draw]] = []
    if not result.curves.empty:
        plots.append(("kruskal_curve.png", kruskal_curve))
    if result.context_ranks:
        plots.append(("context_ranks.png", context_rank_histogram))
    if any(np.isfinite(m.numpy()).any() for m in result.margins.values()):
        plots.append(("margins.png", margin_histogram))
    if _rtol_grids(result.rows):
        plots.append(("rtol_sweep.png", rtol_sweep))
    depth = depth_frame(result)
    if not depth.empty:
        plots.append(("depth_kruskal.png", depth_kruskal))
        if any(_has(depth, c) for c in GEOMETRY):
            plots.append(("depth_geometry.png", depth_geometry))
        if _fraction_tests(depth):
            plots.append(("depth_fractions.png", depth_fractions))
    return plots


def palette_of(result: AuditResult) -> Palette:
    """The palette of every representation in ``result`` (rows, sweep, contexts, depth profile)."""
    names = set(result.rows.get("representation", pd.Series(dtype=str)).dropna())
    names |= set(result.curves.get("representation", pd.Series(dtype=str)).dropna())
    names |= {label.split("@")[0] for label in result.context_ranks}
    names |= set(depth_frame(result).get("representation", pd.Series(dtype=str)).dropna())
    return Palette.of(names)


def depth_frame(result: AuditResult) -> pd.DataFrame:
    """``result.depth`` (one row per layer and weights), or an empty frame when the audit has none."""
    depth = getattr(result, "depth", None)
    if not isinstance(depth, pd.DataFrame) or depth.empty or "depth" not in depth.columns:
        return pd.DataFrame()
    return depth


# ---------------------------------------------------------------------------------------------------
# The audit's figures
# ---------------------------------------------------------------------------------------------------


def kruskal_curve(result: AuditResult, palette: Palette | None = None) -> Figure:
    """Share of full-rank k-subsets of the queries against k: a panel per representation, its weights
    sources overlaid (line style and marker; an open marker over a filled one keeps coincident curves
    visible), the 95% interval shaded where the rows carry it.

    A ring marks each k where every k-subset was decided (exhaustive); the other points are sampled.
    """
    palette = palette or palette_of(result)
    curves = result.curves
    reps = sorted(dict.fromkeys(curves["representation"]), key=representation_order)
    fig, axes = panel_grid(len(reps), sharey=True, top=1.5, per_row=1.45)
    num, n, d = _dims(curves)
    top = float(curves["k"].max())
    marks = [(n, "--", f"k = n = {n}"), (d, ":", f"k = d = {d}"), (num, "-.", f"k = N = {num}")]
    exhaustive_shown = False
    for ax, rep in zip(axes.flat, reps, strict=False):
        for (_, weights), frame in _groups(curves[curves["representation"] == rep]):
            frame = frame.sort_values("k")
            style = palette.line(rep, weights)
            ax.plot(frame["k"], frame["fraction"], label=f"{rep} @ {weights}", **style)
            if _has(frame, "fraction_low") and _has(frame, "fraction_high"):
                low, high = _num(frame["fraction_low"]), _num(frame["fraction_high"])
                ax.fill_between(frame["k"], low, high, color=style["color"], alpha=0.2, linewidth=0)
            if "exhaustive" in frame:
                done = frame[frame["exhaustive"].astype("boolean").fillna(False).astype(bool)]
                if not done.empty:
                    exhaustive_shown = True
                    ax.scatter(done["k"], done["fraction"], s=36, facecolors="none", edgecolors="black",
                               linewidths=0.7, zorder=3)
        for value, ls, _ in marks:
            if value is not None and value <= top * 1.05:
                ax.axvline(value, color=REFERENCE_COLOR, ls=ls, lw=0.9)
        ax.set_title(rep)
        ax.set_ylim(-0.03, 1.03)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
    finish_panels(axes, len(reps), "subset size k (query vectors)")
    fig.supylabel("share of full-rank k-subsets")
    fig.suptitle(_title(result.config.model, "Kruskal rank of the query tokens", num, n, d, _rtol(result)))
    handles = palette.handles([], curves["weights"])
    for value, ls, label in marks:
        if value is not None and value <= top * 1.05:
            handles.append(Line2D([], [], color=REFERENCE_COLOR, ls=ls, lw=0.9, label=label))
    if exhaustive_shown:
        handles.append(
            Line2D(
                [],
                [],
                ls="",
                marker="o",
                ms=6,
                markerfacecolor="none",
                markeredgecolor="black",
                label="all k-subsets decided",
            )
        )
    sampled = _sampled_subsets(curves)
    if sampled:
        handles.append(Line2D([], [], ls="", label=f"others: {sampled} random k-subsets"))
    legend_below(fig, handles)
    return fig


def context_rank_histogram(result: AuditResult, palette: Palette | None = None) -> Figure:
    """How many contexts have each rank (Assumption 2 asks for rank n in every context): grouped bars, one
    bar per representation @ weights at each rank seen."""
    palette = palette or palette_of(result)
    labels = sorted(result.context_ranks, key=_label_order)
    counts = {label: pd.Series(result.context_ranks[label].numpy()).value_counts() for label in labels}
    ranks = sorted(set().union(*(c.index for c in counts.values())))
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.6), layout="constrained")
    positions = np.arange(len(ranks))  # one slot per rank seen: ranks far apart still get a readable bar
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        rep, weights = _split(label)
        heights = [int(counts[label].get(r, 0)) for r in ranks]
        ax.bar(
            positions - 0.4 + width * (i + 0.5),
            heights,
            width=width,
            label=label,
            **palette.bar(rep, weights),
        )
    num, n, d = _dims(result.rows)
    ax.set_xticks(positions, [f"{int(r)} = n" if r == n else str(int(r)) for r in ranks],
                  rotation=90 if len(ranks) > 12 else 0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    total = max((int(c.sum()) for c in counts.values()), default=0)
    ax.set(xlabel="rank of the context matrix (only the ranks seen)", ylabel="contexts (examples)",
           ylim=(0, total * 1.08 if total else 1),
           title=_title(result.config.model, "rank of each context (Assumption 2: rank n)", num, n, d,
                        _rtol(result)))
    reps = [_split(label)[0] for label in labels]
    handles = _bar_handles(palette, reps, [_split(label)[1] for label in labels])
    if n is not None:
        handles.append(
            Line2D([], [], ls="", label=f"full rank n = {n}" + ("" if n in ranks else ": no context"))
        )
    fig.set_figheight(fig.get_figheight() + legend_rows_height(handles))  # 34 blocks: 18 legend rows
    legend_below(fig, handles)
    return fig


def margin_histogram(result: AuditResult, palette: Palette | None = None) -> Figure:
    """Per-context rank margins in decades (how far each context's rank is from changing): a panel per
    representation, its weights sources as outlined histograms on shared bins; each panel says whether
    its margins are exact or a proven lower bound."""
    palette = palette or palette_of(result)
    values = {label: m.numpy()[np.isfinite(m.numpy())] for label, m in result.margins.items()}
    values = {label: v for label, v in values.items() if v.size}
    reps = sorted(dict.fromkeys(_split(label)[0] for label in values), key=representation_order)
    fig, axes = panel_grid(len(reps), top=1.5, per_row=1.3)
    every = np.concatenate(list(values.values())) if values else np.zeros(1)
    bins = np.histogram_bin_edges(every, bins=30)
    kinds = _margin_kinds(result.rows)
    weights_seen: dict[str, None] = {}
    for ax, rep in zip(axes.flat, reps, strict=False):
        labels = sorted((label for label in values if _split(label)[0] == rep), key=_label_order)
        notes = []
        for label in labels:
            weights = _split(label)[1]
            weights_seen[weights] = None
            style = palette.line(rep, weights)
            ax.hist(
                values[label],
                bins=bins,
                histtype="step",
                color=style["color"],
                linestyle=style["linestyle"],
                linewidth=1.2,
                label=label,
            )
            if kinds.get((rep, weights)):
                notes.append((weights, kinds[(rep, weights)]))
        kinds_here = {k for _, k in notes}
        if len(kinds_here) == 1 and len(notes) == len(labels):
            note = kinds_here.pop()
        else:  # a line per weights source, so the title stays within its panel
            note = "\n".join(f"{w}: {k}" for w, k in notes)
        ax.set_title(f"{rep}" + (f"\n({note})" if note else ""))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
    finish_panels(axes, len(reps), "margin (decades)")
    for ax in axes.flat[: len(reps)]:  # every panel its own tick labels: a panel above another keeps them
        ax.xaxis.set_tick_params(labelbottom=True)
    fig.supylabel("contexts (examples)")
    num, n, d = _dims(result.rows)
    fig.suptitle(
        _title(
            result.config.model,
            "context-rank margins (Assumption 2):\ndecades from the deciding singular value\n"
            "to rtol x sigma_max",
            num,
            n,
            d,
            _rtol(result),
        )
    )
    legend_below(fig, palette.handles([], weights_seen))
    return fig


def rtol_sweep(result: AuditResult, palette: Palette | None = None) -> Figure:
    """Each test's fraction against the multiple of its rtol (log x axis), with the threshold, 1x (the
    audit's rtol) and each line's critical rtol (where its share crosses the threshold) and proven bracket
    marked; a bracket end that is open (no positive tolerance proven below, or only the trivial cap rtol < 1
    above) ends in an arrow at the edge of the panel, and a critical rtol beyond the panel is an arrow at
    that edge with its value written beside it (:func:`_draw_critical`).

    One panel per test (a line per representation @ weights); when there are more than
    :data:`MANY_REPRESENTATIONS` representations (an audit across depth) one panel per representation
    instead (a line per test @ weights), so no panel carries more than a handful of lines. The lines of
    a panel are nudged apart vertically by up to :data:`NUDGE` in all, so equal fractions stay visible.
    """
    palette = palette or palette_of(result)
    grids = _rtol_grids(result.rows)
    by_key = {(r["representation"], r["weights"], r["test"]): r for r in _ok(result.rows).to_dict("records")}
    reps = sorted(dict.fromkeys(key[0] for key in grids), key=representation_order)
    tests = [t for t in TEST_LABELS if t in {key[2] for key in grids}]
    per_rep = len(reps) > MANY_REPRESENTATIONS
    panels = reps if per_rep else tests
    fig, axes = panel_grid(len(panels), sharey=True, top=1.5, per_row=1.45)
    xlim = _sweep_xlim(grids, by_key)
    shown: dict[str, dict[str, None]] = {"reps": {}, "weights": {}, "tests": {}}  # ordered sets
    drawn: set[str] = set()  # "bracket", "beyond": what the legend explains
    for ax, panel in zip(axes.flat, panels, strict=False):
        thresholds = set()
        lines = sorted(
            ((key, grid) for key, grid in grids.items() if (key[0] if per_rep else key[2]) == panel),
            key=lambda kv: (representation_order(kv[0][0]), list(TEST_LABELS).index(kv[0][2]), kv[0][1]),
        )
        for j, ((rep, weights, test), grid) in enumerate(lines):
            nudge = (
                NUDGE * (j - (len(lines) - 1) / 2) / max(1, len(lines) - 1)
            )  # coincident lines stay visible
            style = palette.line(rep, weights)
            if per_rep:
                style = {
                    **style,
                    "color": TEST_COLORS[test],
                    "markerfacecolor": TEST_COLORS[test] if style["markerfacecolor"] != "none" else "none",
                    "markeredgecolor": TEST_COLORS[test],
                }
                shown["tests"][test] = None
            shown["reps"][rep] = shown["weights"][weights] = None
            ax.plot(
                list(grid),
                [f + nudge for f in grid.values()],
                label=f"{test if per_rep else rep} @ {weights}",
                **style,
            )
            row = by_key.get((rep, weights, test), {})
            threshold = _float(row.get("threshold"))
            thresholds.add(threshold)
            drawn.add(_draw_critical(
                ax, row, style["color"], (0.5 if threshold is None else threshold) + nudge, xlim
            ))
        for threshold in thresholds - {None}:
            ax.axhline(threshold, color=REFERENCE_COLOR, ls="--", lw=0.8)
        ax.axvline(1.0, color=REFERENCE_COLOR, ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(*xlim)
        ax.set_title(panel if per_rep else TEST_LABELS[panel])
        ax.set_ylim(-0.06, 1.06)
    finish_panels(axes, len(panels), "rtol / the audit's rtol")
    fig.supylabel("fraction (full-rank subsets or rank-n contexts)")
    num, n, d = _dims(result.rows)
    fig.suptitle(_title(result.config.model, "shares against the rank tolerance", num, n, d, _rtol(result)))
    if per_rep:
        handles = [Line2D([], [], color=TEST_COLORS[t], lw=2, label=TEST_LABELS[t]) for t in shown["tests"]]
        handles += palette.handles([], shown["weights"])
    else:
        handles = palette.handles(shown["reps"], shown["weights"])
    handles += [
        Line2D([], [], color=REFERENCE_COLOR, ls="--", lw=0.8, label="threshold"),
        Line2D([], [], color=REFERENCE_COLOR, ls=":", lw=0.8, label="1x: the audit's rtol"),
        Line2D([], [], ls="", marker="D", ms=4, color="0.6", markeredgecolor="black", markeredgewidth=0.5,
               label="critical rtol (flips)")]
    if "bracket" in drawn:
        handles.append(Line2D([], [], color="0.6", lw=3, alpha=0.5, label="its proven bracket"))
        handles.append(Line2D([], [], color="0.6", ls="", marker=">", ms=4, label="bracket open or beyond"))
    if "beyond" in drawn:
        handles.append(Line2D([], [], color="0.6", ls="", marker=">", ms=4.5, markeredgecolor="black",
                              markeredgewidth=0.4, label="critical rtol off the panel"))
    legend_below(fig, handles)
    return fig


def _sweep_xlim(grids: Mapping, by_key: Mapping) -> tuple[float, float]:
    """Log x range of the tolerance panels: the grid widened by :data:`SWEEP_MARGIN` either way (a
    critical rtol or bracket end beyond it is drawn as an arrow at the edge)."""
    xs = [m for grid in grids.values() for m in grid if m > 0] or [0.1, 10.0]
    return min(xs) / SWEEP_MARGIN, max(xs) * SWEEP_MARGIN


def _draw_critical(ax, row: Mapping, color: str, y: float, xlim: tuple[float, float]) -> str:
    """The critical rtol of one row, in multiples of its rtol: inside the panel a diamond (where its value
    is known) with its proven bracket (a bar; an end beyond the panel or open as an arrow at the edge);
    beyond the panel, or a bracket wholly beyond it, an arrow at the edge it lies past labelled with the
    value or bracket (``8.7e-06x``, ``<= 2.4e-06x``, ``0``), and no bar (a bracket clipped to the edge would
    be a sliver that reads as a value). Returns "bracket" when a bar was drawn, "beyond" when an arrow
    with its value was, else ""."""
    critical, rtol = _float(row.get("critical_rtol")), _float(row.get("rtol"))
    low, high = _float(row.get("critical_rtol_low")), _float(row.get("critical_rtol_high"))
    if not rtol or (critical is None and (low is None or high is None)):
        return ""
    open_high = high is None or not (high * (1 + 1e-9) < 1 and math.isfinite(high))  # only the cap rtol < 1
    x = None if critical is None else critical / rtol
    lo = None if low is None else low / rtol
    hi = None if open_high else high / rtol
    if x is not None and not xlim[0] <= x <= xlim[1]:
        label = "0" if x == 0 else _times(x)
        return _beyond(ax, x > xlim[1], label, color, y, xlim)
    if x is None and hi is not None and hi < xlim[0]:  # only a bracket, wholly left of the panel
        label = f"<= {_times(hi)}" if not lo else f"{_times(lo)}-{_times(hi)}"
        return _beyond(ax, False, label, color, y, xlim)
    if x is None and lo is not None and lo > xlim[1]:  # ... wholly right of it
        return _beyond(ax, True, f">= {_times(lo)}", color, y, xlim)
    drawn = ""
    if lo is not None:
        left = max(lo if lo > 0 else xlim[0], xlim[0])
        right = min(xlim[1] if hi is None else hi, xlim[1])
        if right >= left:
            ax.plot([left, right], [y, y], color=color, lw=3, alpha=0.5, solid_capstyle="butt", zorder=3)
            drawn = "bracket"
            if not lo > 0 or lo < xlim[0]:
                ax.plot(left, y, marker="<", ms=4, color=color, ls="", zorder=3)
            if hi is None or hi > xlim[1]:
                ax.plot(right, y, marker=">", ms=4, color=color, ls="", zorder=3)
    if x is not None:
        ax.plot(x, y, marker="D", ms=4, ls="", markeredgecolor="black", markeredgewidth=0.5, color=color,
                zorder=4)
    return drawn


def _times(x: float) -> str:
    """A multiple of rtol for a label: ``8.7e-06x``, ``0.45x``, ``830x``, ``2.0e5x``."""
    if 10 <= x < 1e4:
        return f"{x:.0f}x"
    return f"{x:.2g}x" if 0.01 <= x < 10 else f"{x:.1e}x".replace("e+0", "e").replace("e+", "e")


def _beyond(ax, right: bool, label: str, color: str, y: float, xlim: tuple[float, float]) -> str:
    """An arrow at the panel's right (or left) edge, pointing out, with ``label`` written inside beside it."""
    edge = xlim[1] if right else xlim[0]
    ax.plot(edge, y, marker=">" if right else "<", ms=4.5, color=color, ls="", markeredgecolor="black",
            markeredgewidth=0.4, zorder=4, clip_on=False)
    ax.annotate(label, (edge, y), xytext=(-5 if right else 5, -4), textcoords="offset points",
                ha="right" if right else "left", va="top", fontsize=5.5, color=color, zorder=5,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    return "beyond"


# ---------------------------------------------------------------------------------------------------
# Profiles against depth (result.depth: one row per layer x weights)
# ---------------------------------------------------------------------------------------------------


def depth_kruskal(result: AuditResult, palette: Palette | None = None) -> Figure:
    """Kruskal rank K of the queries against depth, as what is proven: a bar from the certified lower
    bound to the witnessed upper bound (to min(N, d), ending in an arrow, where no dependent subset was
    found), the sampled estimate as a marker inside it (``>= k``: a triangle up; where the smallest tested
    k failed, ``< k``, no marker: the bar's top says it), a filled marker where the bounds meet (K known).
    n and d as horizontal lines."""
    palette = palette or palette_of(result)
    depth = depth_frame(result)
    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH, 3.9), layout="constrained")
    weights_list = list(dict.fromkeys(depth["weights"]))
    num, n, d = _dims(depth)
    top = min(v for v in (num, d) if v is not None) if (num or d) else np.nan
    shown = {"open": False, "estimate": False, "exact": False}
    for weights, frame in depth.groupby("weights", sort=False):
        frame = frame.sort_values("depth")
        xs = _dodge(frame, weights_list)
        style = palette.line("embedding", weights)
        lower = _col(frame, "krank_lower")
        upper = _col(frame, "krank_upper")
        estimate = _estimates(frame)
        for x, lo, hi, est, rep in zip(xs, lower, upper, estimate, frame["representation"], strict=True):
            color = palette.color(rep)
            if not np.isnan(lo):
                end = top if np.isnan(hi) else hi
                ax.plot([x, x], [lo, end], color=color, lw=2.4, alpha=0.45, solid_capstyle="butt",
                        linestyle="-", zorder=2, label=f"{rep} @ {weights}")
                ax.plot(x, lo, marker="_", ms=7, mew=1.2, color=color, zorder=3)
                if np.isnan(hi):
                    shown["open"] = True
                    ax.plot(x, end, marker="^", ms=4, color=color, ls="", zorder=3)
                else:
                    ax.plot(x, hi, marker="_", ms=7, mew=1.2, color="black", zorder=3)
            if not np.isnan(lo) and not np.isnan(hi) and lo == hi:
                shown["exact"] = True
                ax.plot(x, hi, marker=style["marker"], ms=5, ls="", color=color, markeredgecolor="black",
                        markeredgewidth=0.6, zorder=4)
            elif not np.isnan(est):
                shown["estimate"] = True
                ax.plot(x, est, marker=style["marker"], ms=4.5, ls="", color=color,
                        markerfacecolor=color if style["markerfacecolor"] != "none" else "white",
                        markeredgecolor=color, zorder=4)
        along = (frame["representation"] != "random-attention").to_numpy()  # the depth sequence only
        ax.plot(xs[along], estimate[along], color="0.25", linestyle=style["linestyle"], lw=0.7, zorder=1)
    handles = palette.handles(depth["representation"], weights_list, compact=True)
    for value, ls, label in ((n, "--", f"n = {n}"), (d, ":", f"d = {d}")):
        if value is not None:
            ax.axhline(value, color=REFERENCE_COLOR, ls=ls, lw=0.9)
            handles.append(Line2D([], [], color=REFERENCE_COLOR, ls=ls, lw=0.9, label=label))
    handles += [Line2D([], [], color="0.5", lw=2.4, alpha=0.45, label="proven: certified to witnessed")]
    if shown["open"]:
        handles.append(
            Line2D([], [], ls="", marker="^", ms=4, color="0.5", label="none witnessed (to min(N, d))")
        )
    if shown["estimate"]:
        handles.append(Line2D([], [], ls="", marker="o", ms=4.5, color="0.5", label="sampled: K >= k"))
    if shown["exact"]:
        handles.append(Line2D([], [], ls="", marker="o", ms=5, color="0.5", markeredgecolor="black",
                              markeredgewidth=0.6, label="bounds meet: K known"))
    _depth_axis(ax)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(
        ylabel="Kruskal rank K of the queries (vectors)",
        ylim=(0, None),
        title=_title(_model(result, depth), "Kruskal rank of the queries by depth", num, n, d, _rtol(result)),
    )
    legend_below(fig, handles)
    return fig


def _col(frame: pd.DataFrame, column: str) -> np.ndarray:
    return _num(frame[column]).to_numpy() if column in frame.columns else np.full(len(frame), np.nan)


def _estimates(frame: pd.DataFrame) -> np.ndarray:
    """The sampled estimates of a depth frame, NaN where no tested k held (a depth.csv written before
    ``krank_sampled`` has 0 there: a bound, never a value)."""
    est = _col(frame, "krank_estimate")
    if "krank_sampled" not in frame.columns:
        est = np.where(est > 0, est, np.nan)
    return est


def depth_geometry(result: AuditResult, palette: Palette | None = None) -> Figure:
    """Effective rank, stable rank and anisotropy of the queries, raw and mean-centred, and the collapse
    residual of the contexts, against depth (a panel each)."""
    palette = palette or palette_of(result)
    depth = depth_frame(result)
    weights_list = list(dict.fromkeys(depth["weights"]))
    columns = [c for c in GEOMETRY if _has(depth, c)]
    fig, axes = panel_grid(len(columns), top=1.6, per_row=1.25)
    for ax, column in zip(axes.flat, columns, strict=False):
        for weights, frame in depth.groupby("weights", sort=False):
            frame = frame.sort_values("depth")
            _depth_line(ax, palette, frame, _dodge(frame, weights_list), _num(frame[column]), weights)
        ax.set_title(GEOMETRY[column])
        values = _num(depth[column]).dropna()
        if (
            column.startswith("effective_rank")
            and len(values)
            and values.min() > 0
            and values.max() > 20 * values.min()
        ):
            ax.set_yscale("log")  # effective ranks spanning decades: the small ones stay readable
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    finish_panels(axes, len(columns), "depth")
    num, n, d = _dims(depth)
    fig.suptitle(
        _title(
            _model(result, depth),
            "geometry of the tokens by depth (0 = embedding)\nraw and mean-centred queries",
            num,
            n,
            d,
        )
    )
    legend_below(fig, palette.handles(depth["representation"], depth["weights"], compact=True))
    return fig


def depth_fractions(result: AuditResult, palette: Palette | None = None) -> Figure:
    """The fraction of each test against depth (one panel per test), the threshold marked, and each
    point's strict statement: a cross where a witness refutes it, a ring where it is proven."""
    palette = palette or palette_of(result)
    depth = depth_frame(result)
    weights_list = list(dict.fromkeys(depth["weights"]))
    tests = _fraction_tests(depth)
    fig, axes = panel_grid(len(tests), sharey=True)
    marked: dict[str, None] = {}
    for ax, test in zip(axes.flat, tests, strict=False):
        threshold = _threshold(result, test)
        for weights, frame in depth.groupby("weights", sort=False):
            frame = frame.sort_values("depth")
            xs, ys = _dodge(frame, weights_list), _num(frame[f"{test}_fraction"])
            _depth_line(ax, palette, frame, xs, ys, weights)
            statements = frame.get(f"{test}_statement", pd.Series(index=frame.index, dtype=object))
            for x, y, statement in zip(xs, ys, statements, strict=True):
                if isinstance(statement, str) and statement in STATEMENT_MARKS and not math.isnan(y):
                    marker, size, _ = STATEMENT_MARKS[statement]
                    marked[statement] = None
                    ax.plot(x, y, ls="", marker=marker, ms=size, markerfacecolor="none",
                            markeredgecolor="black", markeredgewidth=0.6, zorder=4)
        if threshold is not None:
            ax.axhline(threshold, color=REFERENCE_COLOR, ls="--", lw=0.8)
        ax.set_title(TEST_LABELS[test])
        ax.set_ylim(-0.04, 1.04)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    finish_panels(axes, len(tests), DEPTH_SHORT)
    fig.supylabel("fraction (full-rank subsets or rank-n contexts)")
    num, n, d = _dims(depth)
    fig.suptitle(_title(_model(result, depth), "test fractions by depth", num, n, d, _rtol(result)))
    handles = palette.handles(depth["representation"], depth["weights"], compact=True)
    handles.append(Line2D([], [], color=REFERENCE_COLOR, ls="--", lw=0.8, label="threshold of the test"))
    for statement in marked:
        marker, size, label = STATEMENT_MARKS[statement]
        handles.append(Line2D([], [], ls="", marker=marker, ms=size, markerfacecolor="none",
                              markeredgecolor="black", markeredgewidth=0.6, label=label))
    legend_below(fig, handles)
    return fig


def _depth_line(ax, palette: Palette, frame: pd.DataFrame, x, y, weights: str) -> None:
    """One weights source's profile: a dark line in its style, each point in its representation's colour."""
    style = palette.line("embedding", weights)
    along = (frame["representation"] != "random-attention").to_numpy()  # the depth sequence only
    ax.plot(np.asarray(x)[along], np.asarray(y)[along], color="0.25", linestyle=style["linestyle"], lw=0.9,
            label=weights, zorder=2)
    for xi, yi, rep in zip(x, y, frame["representation"], strict=True):
        point = palette.line(rep, weights)
        ax.plot(xi, yi, ls="", marker=point["marker"], ms=4.5, color=point["color"],
                markerfacecolor=point["markerfacecolor"], markeredgecolor=point["color"], zorder=3,
                label=f"{rep} @ {weights}")


def _dodge(frame: pd.DataFrame, weights_list: list[str]) -> np.ndarray:
    """Depths of a weights source's rows, shifted a little so the weights sources sit side by side;
    ``random-attention`` (depth 0 like the embedding) half a step to the left of it, so neither hides
    the other."""
    i = weights_list.index(frame["weights"].iloc[0])
    aside = np.where(frame["representation"].to_numpy() == "random-attention", -0.5, 0.0)
    return frame["depth"].to_numpy(float) + aside + 0.2 * (i - (len(weights_list) - 1) / 2)


def _depth_axis(ax) -> None:
    ax.set_xlabel(DEPTH_LABEL)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


# ---------------------------------------------------------------------------------------------------
# Helpers: columns that may be missing, titles
# ---------------------------------------------------------------------------------------------------


def parse_rtol_grid(value: Any) -> dict[float, float] | None:
    """``{rtol multiplier: fraction}`` from a dict or its CSV form ``"0.1:1.0;0.2:0.98"``; None when empty."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, Mapping):
        pairs = [(float(k), float(v)) for k, v in value.items()]
    else:
        pairs = [tuple(map(float, part.split(":"))) for part in str(value).split(";") if part.strip()]
    return dict(sorted(pairs)) or None


def _rtol_grids(rows: pd.DataFrame) -> dict[tuple[str, str, str], dict[float, float]]:
    if "rtol_grid" not in rows.columns:
        return {}
    grids = {}
    for row in _ok(rows).to_dict("records"):
        grid = parse_rtol_grid(row.get("rtol_grid"))
        if grid:
            grids[(row["representation"], row["weights"], row["test"])] = grid
    return grids


def _margin_kinds(rows: pd.DataFrame) -> dict[tuple[str, str], str]:
    """(representation, weights) -> "exact" | "lower bound" from the Assumption 2 rows' ``margin_bound``."""
    if "margin_bound" not in rows.columns:
        return {}
    kinds = {}
    for row in _ok(rows)[lambda f: f["test"] == "assumption2"].to_dict("records"):
        bound = _bool(row.get("margin_bound"))
        if bound is not None:
            kinds[(row["representation"], row["weights"])] = "lower bound" if bound else "exact"
    return kinds


def _fraction_tests(depth: pd.DataFrame) -> list[str]:
    return [t for t in TEST_LABELS if _has(depth, f"{t}_fraction")]


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["status"] == "ok"] if "status" in rows.columns else rows


def _groups(frame: pd.DataFrame):
    """(representation, weights) groups in the order embedding, random-attention, block.0, ..."""
    groups = list(frame.groupby(["representation", "weights"], sort=False))
    return sorted(groups, key=lambda g: representation_order(g[0][0]))


def _split(label: str) -> tuple[str, str]:
    """``"block.0@random"`` -> ``("block.0", "random")``."""
    rep, _, weights = label.partition("@")
    return rep, weights


def _label_order(label: str) -> tuple:
    rep, weights = _split(label)
    return (*representation_order(rep), weights)


def _bar_handles(palette: Palette, reps: list[str], weights: list[str]) -> list[Patch]:
    out = [Patch(label=r, facecolor=palette.color(r), edgecolor=palette.color(r))
           for r in sorted(dict.fromkeys(reps), key=representation_order)]
    for w in dict.fromkeys(weights):
        bar = palette.bar("embedding", w)
        out.append(
            Patch(
                label=f"{w} weights",
                facecolor="white" if "hatch" in bar else "0.3",
                edgecolor="0.3",
                hatch=bar.get("hatch"),
            )
        )
    return out


def _has(frame: pd.DataFrame, column: str) -> bool:
    """The column exists and holds at least one number."""
    return column in frame.columns and _num(frame[column]).notna().any()


def _num(series: pd.Series) -> pd.Series:
    return pd.to_numeric(series, errors="coerce").astype(float)


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _bool(value: Any) -> bool | None:
    if isinstance(value, str):
        return {"true": True, "false": False}.get(value.strip().lower())
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return bool(value)


def _dims(frame: pd.DataFrame) -> tuple[int | None, int | None, int | None]:
    """N, n, d of the first row that has them."""
    out = []
    for key in ("N", "n", "d"):
        values = _num(frame[key]).dropna() if key in frame.columns else pd.Series(dtype=float)
        out.append(int(values.iloc[0]) if not values.empty else None)
    return out[0], out[1], out[2]


def _threshold(result: AuditResult, test: str) -> float | None:
    """The share a test needs to hold: from its rows, else the audit's threshold (Kruskal tests)."""
    rows = result.rows
    if {"test", "threshold"} <= set(rows.columns):
        values = _num(rows.loc[rows["test"] == test, "threshold"]).dropna()
        if not values.empty:
            return float(values.iloc[0])
    threshold = getattr(result.config, "threshold", None)
    return float(threshold) if threshold is not None and test != "assumption2" else None


def _model(result: AuditResult, depth: pd.DataFrame) -> str:
    return str(depth["model"].iloc[0]) if "model" in depth.columns else str(result.config.model)


def _rtol(result: AuditResult) -> str:
    """``rtol = 1e-06``, or the default rule with the token dtype."""
    if result.config.rtol is not None:
        return f"rtol = {result.config.rtol:g}"
    dtypes = result.rows["dtype"].dropna().unique() if "dtype" in result.rows.columns else []
    return "rtol = max(k, d) x eps" + (f"({dtypes[0]})" if len(dtypes) == 1 else "")


def _title(model: str, what: str, num: int | None, n: int | None, d: int | None, rtol: str = "") -> str:
    """Model, what is shown, the sizes and the tolerance; lines wrapped to fit a column between phrases,
    never inside a parenthesis or between words of one phrase (a model given as a long folder path is
    broken, not clipped)."""
    dims = ", ".join(f"{name} = {v}" for name, v in (("N", num), ("n", n), ("d", d)) if v is not None)
    text = f"{model}: {what}\n{dims}" + (f"\n{rtol}" if rtol else "")
    return "\n".join(wrapped for line in text.split("\n") for wrapped in _phrase_lines(line, TITLE_WIDTH))


def _phrases(line: str) -> list[str]:
    """``line`` cut after ``:``, ``;`` and ``,`` and before ``(``, outside parentheses only."""
    out, depth, start = [], 0, 0
    for i, char in enumerate(line):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ":;," and line[i + 1 : i + 2] == " ":
            out.append(line[start : i + 1])
            start = i + 2
        elif depth == 1 and char == "(" and i > start and line[i - 1] == " ":
            out.append(line[start : i - 1])
            start = i
    return [p for p in (*out, line[start:]) if p]


def _phrase_lines(line: str, width: int) -> list[str]:
    """``line`` packed into lines of at most ``width`` characters, whole phrases (:func:`_phrases`) kept
    together; only a phrase longer than ``width`` is broken between words (a long path at any character)."""
    lines: list[str] = []
    for phrase in _phrases(line):
        if lines and len(lines[-1]) + 1 + len(phrase) <= width:
            lines[-1] += " " + phrase
        elif len(phrase) <= width:
            lines.append(phrase)
        else:
            lines += textwrap.wrap(phrase, width, break_long_words=True, break_on_hyphens=False)
    return lines or [""]


def _sampled_subsets(curves: pd.DataFrame) -> int | None:
    """The number of random k-subsets behind the sampled (not exhaustive) points, if one number."""
    if "subsets" not in curves.columns:
        return None
    sampled = curves
    if "exhaustive" in curves.columns:
        sampled = curves[~curves["exhaustive"].astype("boolean").fillna(False).astype(bool)]
    values = _num(sampled["subsets"]).dropna().unique()
    return int(values.max()) if len(values) else None
