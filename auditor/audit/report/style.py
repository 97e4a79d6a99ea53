"""One look for every figure: a colour per representation, a line style per weights source, font sizes
that stay legible at a single-column width.

- Colours: ``embedding`` and ``block.L`` follow a perceptually ordered colormap by depth (``embedding`` is
  depth 0, ``block.L`` is depth L + 1, the index into Hugging Face's ``hidden_states``), so a deeper layer
  is always further along the map; ``random-attention`` has a colour of its own outside the map; any other
  representation (e.g. ``tokens`` of tensors you hold) gets a qualitative colour in sorted-name order.
- Weights: the random and pretrained versions of one representation share its colour and differ by line
  style, marker and (for bars) hatching.

Build one :class:`Palette` from every representation a figure set shows (:meth:`Palette.of`) and draw all
the figures with it: the same representation then has the same colour in each of them.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from auditor.audit.report.catalogue import representation_depth  # noqa: E402

COLUMN_WIDTH = 3.5  # inches: one column of a two-column paper
PAGE_WIDTH = 7.0  # inches: both columns
DPI = 300
DEPTH_COLORMAP = "viridis"
DEPTH_SPAN = (0.0, 0.88)  # the part of the colormap used: its palest end is hard to see on white
RANDOM_ATTENTION_COLOR = "#d62728"  # red: outside viridis, so never mistaken for a depth
OTHER_COLORS = ("#1f77b4", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
REFERENCE_COLOR = "0.35"  # n, d, thresholds and other reference lines
# a point's strict statement, marked over it (depth_fractions.png, compare_kruskal.png): marker, size, legend
# label; "not decided" has no mark
STATEMENT_MARKS = {"refuted": ("x", 5, "statement refuted (witness)"),
                   "proven": ("o", 7, "statement proven (certified)")}

RC = {  # points: >= 7 pt everywhere, so text stays legible when the figure is printed 3.5 inches wide
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "legend.title_fontsize": 7,
    "figure.titlesize": 8,
    "figure.labelsize": 8,
    "lines.linewidth": 1.2,
    "lines.markersize": 3.5,
    "axes.linewidth": 0.6,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.4,
    "savefig.dpi": DPI,
    "figure.dpi": 100,
    "axes.grid": True,
    "legend.frameon": False,
}



@dataclass(frozen=True)
class WeightsStyle:
    """How one weights source is drawn: ``linestyle``, ``marker``, ``filled`` marker faces, bar ``hatch``."""

    linestyle: str
    marker: str
    filled: bool
    hatch: str


WEIGHTS_STYLES = {
    "pretrained": WeightsStyle("-", "o", True, ""),
    "random": WeightsStyle("--", "s", False, "////"),
}
_OTHER_WEIGHTS = (WeightsStyle(":", "^", True, "...."), WeightsStyle("-.", "D", False, "xxx"))


def depth_of(representation: str) -> int | None:
    """0 for ``embedding``, L + 1 for ``block.L``, None for any other representation (``random-attention``
    included: the figures draw it apart from the depth axis)."""
    return None if representation == "random-attention" else representation_depth(representation)


def weights_style(weights: str) -> WeightsStyle:
    """The style of a weights source (``pretrained``, ``random``; others get the next spare style by name)."""
    if weights in WEIGHTS_STYLES:
        return WEIGHTS_STYLES[weights]
    return _OTHER_WEIGHTS[sum(map(ord, weights)) % len(_OTHER_WEIGHTS)]


@dataclass(frozen=True)
class Palette:
    """Colours of the representations of one set of figures (build it with :meth:`of`)."""

    max_depth: int
    others: tuple[str, ...]  # representations outside the depth map, sorted

    @classmethod
    def of(cls, representations: Iterable[str]) -> Palette:
        """The palette of these representations (duplicates and order do not matter)."""
        names = set(representations)
        depths = [depth for depth in map(depth_of, names) if depth is not None]
        others = sorted(r for r in names if depth_of(r) is None and r != "random-attention")
        return cls(max([1, *depths]), tuple(others))

    def color(self, representation: str) -> str:
        """Hex colour of a representation."""
        if representation == "random-attention":
            return RANDOM_ATTENTION_COLOR
        depth = depth_of(representation)
        if depth is not None:
            lo, hi = DEPTH_SPAN
            return to_hex(
                plt.get_cmap(DEPTH_COLORMAP)(lo + (hi - lo) * min(depth, self.max_depth) / self.max_depth)
            )
        index = self.others.index(representation) if representation in self.others else len(self.others)
        return OTHER_COLORS[index % len(OTHER_COLORS)]

    def line(self, representation: str, weights: str) -> dict[str, Any]:
        """``plot`` keyword arguments of one representation @ weights."""
        color, style = self.color(representation), weights_style(weights)
        return {"color": color, "linestyle": style.linestyle, "marker": style.marker,
                "markerfacecolor": color if style.filled else "none", "markeredgecolor": color}

    def bar(self, representation: str, weights: str) -> dict[str, Any]:
        """``bar`` keyword arguments of one representation @ weights (random weights: hatched, paler)."""
        color, style = self.color(representation), weights_style(weights)
        if not style.hatch:
            return {"color": color, "edgecolor": color, "linewidth": 0.6}
        return {"facecolor": "white", "edgecolor": color, "hatch": style.hatch, "linewidth": 0.6}

    def handles(self, representations: Iterable[str], weights: Iterable[str], *, compact: bool = False
                ) -> list[Line2D]:
        """Legend entries: one colour per representation, then one line style per weights source.

        ``compact``: of many layers (more than four ``block.L``) list only the first two and the last,
        with an ellipsis between them (for figures whose x axis is the depth already).
        """
        reps = sorted(dict.fromkeys(representations), key=representation_order)
        out = [Line2D([], [], color=self.color(r), lw=3, label=r) for r in reps]
        blocks = [i for i, r in enumerate(reps) if r.startswith("block.") and depth_of(r) is not None]
        if compact and len(blocks) > 4:
            keep = {*blocks[:2], blocks[-1]}
            out = [h for i, h in enumerate(out) if i not in blocks or i in keep]
            out.insert(out.index(next(h for h in out if h.get_label() == reps[blocks[-1]])),
                       Line2D([], [], ls="", label="... (colour: depth)"))
        known = list(WEIGHTS_STYLES)
        for w in sorted(
            dict.fromkeys(weights), key=lambda w: (known.index(w) if w in known else len(known), w)
        ):
            style = weights_style(w)
            out.append(Line2D([], [], color="black", linestyle=style.linestyle, marker=style.marker,
                              markerfacecolor="black" if style.filled else "none", label=f"{w} weights"))
        return out


def representation_order(representation: str) -> tuple[int, int, str]:
    """Sort key: embedding, random-attention, block.0, block.1, ..., then the others by name."""
    depth = depth_of(representation)
    if representation == "embedding":
        return (0, 0, "")
    if representation == "random-attention":
        return (1, 0, "")
    return (2, depth, "") if depth is not None else (3, 0, representation)


@contextmanager
def figure_style() -> Iterator[None]:
    """Matplotlib settings of every figure (font sizes, grid, dpi) for the figures drawn inside."""
    with plt.rc_context(RC):
        yield


def legend_below(fig, handles: list, ncol: int = 2, **kwargs: Any) -> None:
    """A legend under the axes, outside them, so it never covers a curve (needs ``layout="constrained"``)."""
    if handles:
        fig.legend(
            handles=handles,
            loc="outside lower center",
            ncol=ncol,
            handlelength=2.0,
            columnspacing=1.0,
            handletextpad=0.5,
            **kwargs,
        )


def legend_rows_height(handles: list, ncol: int = 2, room: int = 3) -> float:
    """Inches a figure must grow by for a :func:`legend_below` of ``handles`` in ``ncol`` columns, beyond the
    ``room`` rows its height already allows (one row: the legend font's line spacing, 1.4 x its size)."""
    from matplotlib.font_manager import FontProperties

    rows = math.ceil(len(handles) / ncol)
    line = 1.4 * FontProperties(size=plt.rcParams["legend.fontsize"]).get_size_in_points() / 72
    return max(0, rows - room) * line


def panel_grid(count: int, *, sharey: bool = False, top: float = 1.3, per_row: float = 1.5):
    """``count`` small panels at a column width, two a row (one when alone): ``(fig, axes)``."""
    cols = 1 if count == 1 else 2
    rows = math.ceil(count / cols)
    return plt.subplots(rows, cols, figsize=(COLUMN_WIDTH, top + per_row * rows), layout="constrained",
                        sharex=True, sharey=sharey, squeeze=False)


def finish_panels(axes, used: int, xlabel: str) -> None:
    """Hide the panels beyond the first ``used`` and label the x axis under the lowest visible panel of
    each column (wrapped to a panel's width when panels sit side by side); the tick labels of a hidden
    bottom panel move to the visible panel above it."""
    for ax in axes.flat[used:]:
        ax.set_visible(False)
        above = axes.flat[list(axes.flat).index(ax) - axes.shape[1]] if axes.shape[0] > 1 else None
        if above is not None and above.get_visible():
            above.xaxis.set_tick_params(labelbottom=True)
    wrapped = xlabel if axes.shape[1] == 1 else textwrap.fill(xlabel, 20)  # half a column per panel
    for column in range(axes.shape[1]):
        shown = [ax for ax in axes[:, column] if ax.get_visible()]
        if shown:
            shown[-1].set_xlabel(wrapped)
