"""Figures of ``audit compare``: the Kruskal fractions of several reports by test, and their depth
profiles overlaid. Same look as the audit's figures (:mod:`auditor.audit.report.style`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from auditor.audit.report.style import (  # noqa: E402
    COLUMN_WIDTH,
    OTHER_COLORS,
    REFERENCE_COLOR,
    STATEMENT_MARKS,
    Palette,
    finish_panels,
    legend_below,
    panel_grid,
    representation_order,
    weights_style,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SHORT_TITLES = {"assumption2": "A2\nrank n", "assumption1": "A1\nk = n", "assumption3": "A3\nk = n",
                "general_position": "gen.\npos."}  # four panels in 3.5 inches

DEPTH_PANELS = {  # depth.csv column -> y label (with its unit), drawn when a report has it
    "krank_lower": "Kruskal rank K\n(vectors)",  # the proven interval, with the sampled estimate in it
    "assumption2_fraction": "Assumption 2\nfraction",
    "assumption1_fraction": "Assumption 1\nfraction",
    "assumption3_fraction": "Assumption 3\nfraction",
    "general_position_fraction": "general position\nfraction",
    "effective_rank": "effective rank\n(dimensions)",
    "anisotropy": "anisotropy\n(mean cosine)",
}


def kruskal_by_test(table: pd.DataFrame, labels: Mapping[str, str]) -> Figure:
    """Dot plot: one panel per test (Assumption 2 and the Kruskal tests), one line of the y axis per
    report x representation @ weights, the fraction with its 95% interval (where the report has it);
    colour = representation, marker = weights; a black cross over a point whose strict statement a witness
    refutes, a black ring around one whose statement is proven (none: not decided).

    ``table``: the rows of :func:`auditor.audit.compare.compare_table`; ``labels``: report folder -> its name.
    """
    kruskal = table[table["test"].isin(list(SHORT_TITLES)) & table["fraction"].notna()]
    tests = [t for t in SHORT_TITLES if t in set(kruskal["test"])]
    marked: dict[str, None] = {}
    keys = list(
        dict.fromkeys(zip(kruskal["report"], kruskal["representation"], kruskal["weights"], strict=True))
    )
    keys.sort(key=lambda k: (list(labels).index(k[0]) if k[0] in labels else 0, representation_order(k[1])))
    palette = Palette.of(kruskal["representation"])
    fig, axes = plt.subplots(
        1,
        len(tests),
        figsize=(COLUMN_WIDTH, 2.9 + 0.2 * len(keys)),
        layout="constrained",
        sharey=True,
        squeeze=False,
    )
    for ax, test in zip(axes[0], tests, strict=True):
        rows = kruskal[kruskal["test"] == test]
        for y, key in enumerate(keys):
            found = rows[
                (rows["report"] == key[0]) & (rows["representation"] == key[1]) & (rows["weights"] == key[2])
            ]
            if found.empty:
                continue
            row = found.iloc[0]
            style = palette.line(key[1], key[2])
            if not (pd.isna(row["fraction_low"]) or pd.isna(row["fraction_high"])):
                ax.plot([row["fraction_low"], row["fraction_high"]], [y, y], color=style["color"], lw=1.5)
            ax.plot(row["fraction"], y, ls="", marker=style["marker"], ms=4, color=style["color"],
                    markerfacecolor=style["markerfacecolor"], markeredgecolor=style["color"])
            statement = row.get("statement")
            if isinstance(statement, str) and statement in STATEMENT_MARKS:
                marker, size, _ = STATEMENT_MARKS[statement]
                marked[statement] = None
                ax.plot(row["fraction"], y, ls="", marker=marker, ms=size, markerfacecolor="none",
                        markeredgecolor="black", markeredgewidth=0.7, zorder=4)
        ax.set_title(SHORT_TITLES[test], fontsize=7)
        ax.set_xlim(-0.08, 1.08)
        ax.set_xticks([0, 1], ["0", "1"])
        ax.set_xlabel("share")
    separators = [i - 0.5 for i in range(1, len(keys)) if keys[i][0] != keys[i - 1][0]]
    for ax in axes[0]:
        for y in separators:
            ax.axhline(y, color=REFERENCE_COLOR, lw=0.6)
    axes[0][0].set_yticks(range(len(keys)), [f"{labels.get(r, r)}: {rep}" for r, rep, _ in keys])
    axes[0][0].set_ylim(len(keys) - 0.5, -0.5)
    fig.suptitle("assumption tests across reports: the share of\n"
                 "full-rank k-subsets (A2: of rank-n contexts)", fontsize=7)
    handles = palette.handles(kruskal["representation"], kruskal["weights"])
    for statement in marked:
        marker, size, label = STATEMENT_MARKS[statement]
        handles.append(Line2D([], [], ls="", marker=marker, ms=size, markerfacecolor="none",
                              markeredgecolor="black", markeredgewidth=0.7, label=label))
    if kruskal["fraction_low"].notna().any():
        handles.append(Line2D([], [], color="0.4", lw=1.5, label="95% interval (Clopper-Pearson)"))
    legend_below(fig, handles)
    return fig


DEPTH_SHIFT = 0.15  # depth units between the markers of neighbouring reports in :func:`depth_overlay`


def depth_overlay(depths: Mapping[str, pd.DataFrame]) -> Figure:
    """Depth profiles of several reports overlaid (colour = report, line style = weights), one panel per
    quantity of :data:`DEPTH_PANELS` that some report has. The Kruskal rank is the proven interval (a bar
    from the certified lower to the witnessed upper bound) with the sampled estimate inside it, never a
    0 where no tested k held; ``random-attention`` is not a depth and is left out."""
    columns = [c for c in DEPTH_PANELS if any(_has(f, c) for f in depths.values())]
    fig, axes = panel_grid(len(columns))
    colors = {label: OTHER_COLORS[i % len(OTHER_COLORS)] for i, label in enumerate(depths)}
    # each report's markers a little to the side, so equal values (every fraction 1.0) stay visible
    shift = {label: DEPTH_SHIFT * (i - (len(depths) - 1) / 2) for i, label in enumerate(depths)}
    weights_seen: dict[str, None] = {}
    for ax, column in zip(axes.flat, columns, strict=False):
        for label, frame in depths.items():
            if not _has(frame, column):
                continue
            for weights, part in frame.groupby("weights", sort=False):
                part = part.sort_values("depth")
                part = (
                    part[part["representation"] != "random-attention"] if "representation" in part else part
                )
                style = weights_style(str(weights))
                weights_seen[str(weights)] = None
                y = pd.to_numeric(part[column], errors="coerce")
                if column == "krank_lower":
                    _krank_interval(ax, part, colors[label], shift[label])
                    y = _krank_estimate(part)
                ax.plot(
                    part["depth"] + shift[label],
                    y,
                    color=colors[label],
                    linestyle=style.linestyle,
                    marker=style.marker,
                    ms=3,
                    markerfacecolor=colors[label] if style.filled else "none",
                    label=f"{label} @ {weights}",
                )
        ax.set_ylabel(DEPTH_PANELS[column])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))  # ticks apart at any depth
    finish_panels(axes, len(columns), "depth")
    fig.suptitle("depth profiles across reports (depth 0 = embedding)")
    for ax, column in zip(axes.flat, columns, strict=False):
        if column == "krank_lower":
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    handles = [Line2D([], [], color=c, lw=3, label=label) for label, c in colors.items()]
    for w in weights_seen:
        style = weights_style(w)
        handles.append(Line2D([], [], color="black", linestyle=style.linestyle, marker=style.marker,
                              markerfacecolor="black" if style.filled else "none", label=f"{w} weights"))
    legend_below(fig, handles)
    return fig


def _krank_interval(ax, part: pd.DataFrame, color: str, shift: float = 0.0) -> None:
    """The proven interval of the Kruskal rank at each depth: certified lower to witnessed upper (to
    min(N, d) where none was witnessed)."""
    lower = pd.to_numeric(part["krank_lower"], errors="coerce")
    upper = pd.to_numeric(part.get("krank_upper", pd.Series(index=part.index, dtype=float)), errors="coerce")
    top = pd.concat([pd.to_numeric(part.get(c, pd.Series(index=part.index, dtype=float)), errors="coerce")
                     for c in ("N", "d")], axis=1).min(axis=1)
    ax.vlines(part["depth"] + shift, lower, upper.fillna(top), color=color, lw=2.2, alpha=0.3)


def _krank_estimate(part: pd.DataFrame) -> pd.Series:
    """The sampled estimate where a tested k held (a depth.csv from before ``krank_sampled`` has 0 where
    none held: a bound, not drawn), K itself where the bounds meet."""
    est = pd.to_numeric(part.get("krank_estimate", pd.Series(index=part.index, dtype=float)), errors="coerce")
    return est.where(est > 0)


def _has(frame: pd.DataFrame, column: str) -> bool:
    return column in frame.columns and np.isfinite(pd.to_numeric(frame[column], errors="coerce")).any()
