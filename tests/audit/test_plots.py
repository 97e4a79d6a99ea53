"""The audit's figures: each one drawn from a synthetic result (rows, sweep, per-context ranks, depth
profile) and saved as a 300 dpi PNG; one colour per representation across weights and figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.colors import to_hex
from PIL import Image

from auditor.audit.config import AuditConfig
from auditor.audit.report import plots
from auditor.audit.report.result import AuditResult
from auditor.audit.report.schema import rows_frame
from auditor.audit.report.style import (
    COLUMN_WIDTH,
    DPI,
    RANDOM_ATTENTION_COLOR,
    Palette,
    depth_of,
    figure_style,
)
from auditor.core.atomic import Staged

REPS = ("embedding", "random-attention", "block.0", "block.1")
REPS_IN_ORDER = (
    "embedding",
    "random-attention",
    "block.0",
    "block.1",
)  # panels: embedding, random-attention, blocks
WEIGHTS = ("pretrained", "random")
TESTS = ("assumption2", "assumption1", "assumption3", "general_position")
N, n, d = 40, 4, 16


def _rows(new_columns: bool = True) -> pd.DataFrame:
    records = []
    for w in WEIGHTS:
        for rep in REPS:
            for test in TESTS:
                row = {"model": "tiny", "representation": rep, "weights": w, "test": test, "status": "ok",
                       "k": n if test != "general_position" else d, "N": N, "n": n, "d": d, "fraction": 0.5,
                       "share_meets_threshold": False, "threshold": 1.0 if test == "assumption2" else 0.99,
                       "rtol": 1e-6,
                       "dtype": "float32", "subsets": 100, "exhaustive": False}
                if new_columns:
                    row |= {
                        "margin_bound": rep == "block.1",
                        "critical_rtol": 3e-6,
                        "critical_rtol_low": 2e-6,
                        "critical_rtol_high": 4e-6,
                        "rtol_grid": "0.1:1.0;1:0.5;10:0.0",
                    }
                records.append(row)
    return rows_frame(records)


def _curves() -> pd.DataFrame:
    frames = []
    for w in WEIGHTS:
        for rep in REPS:
            ks = np.array([1, 4, 8, 12, 16])
            frames.append(pd.DataFrame({"k": ks, "N": N, "d": d, "n": n, "subsets": 50,
                                        "exhaustive": ks == 16, "fraction": (ks <= 8).astype(float),
                                        "representation": rep, "weights": w}))
    return pd.concat(frames, ignore_index=True)


def _depth() -> pd.DataFrame:
    records = []
    for w in WEIGHTS:
        for depth, rep in enumerate(("embedding", "block.0", "block.1")):
            records.append(
                {
                    "model": "tiny",
                    "weights": w,
                    "representation": rep,
                    "depth": depth,
                    "N": N,
                    "n": n,
                    "d": d,
                    "rtol": 1e-6,
                    "assumption1_fraction": 1.0,
                    "assumption1_share_meets_threshold": True,
                    "assumption1_critical_rtol": 1e-4,
                    "general_position_fraction": 0.0,
                    "krank_estimate": 10 - depth,
                    "krank_lower": 2,
                    "krank_lower_method": "babel",
                    "krank_upper": 10 - depth if depth else None,
                    "effective_rank": 12.0 - depth,
                    "stable_rank": 3.0,
                    "anisotropy": 0.1 * depth,
                    "collapse_residual": None,
                }
            )
    return pd.DataFrame(records)


def _result(*, new_columns: bool = True, depth: bool = True) -> AuditResult:
    gen = torch.Generator().manual_seed(0)
    labels = [f"{rep}@{w}" for w in WEIGHTS for rep in REPS]
    ranks = {label: torch.randint(n - 2, n + 1, (N,), generator=gen) for label in labels}
    margins = {label: torch.rand(N, generator=gen, dtype=torch.float64) * 3 for label in labels}
    result = AuditResult(rows=_rows(new_columns), curves=_curves(), config=AuditConfig(model="vit-base"),
                         context_ranks=ranks, margins=margins)
    result.depth = _depth() if depth else pd.DataFrame()
    return result


def _line_colors(fig) -> dict[str, str]:
    """label -> colour of every labelled line of a figure."""
    return {line.get_label(): to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def test_every_figure_is_a_300_dpi_png_one_column_wide(tmp_path):
    result = _result()
    with Staged() as staged:
        paths = plots.write_plots(result, tmp_path, staged, pdf=True)
        staged.commit()
    assert [p.name for p in paths] == list(plots.PLOT_FILES)
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG"
            assert image.width == round(COLUMN_WIDTH * DPI)
            assert image.info["dpi"] == pytest.approx((DPI, DPI), abs=0.5)
        assert path.with_suffix(".pdf").read_bytes().startswith(b"%PDF")


def test_a_report_without_the_new_columns_skips_their_figures(tmp_path):
    result = _result(new_columns=False, depth=False)
    names = [name for name, _ in plots.applicable_plots(result)]
    assert names == ["kruskal_curve.png", "context_ranks.png", "margins.png"]
    with figure_style():
        fig = plots.margin_histogram(result)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == list(
        REPS_IN_ORDER
    )  # a panel per representation; no "exact" / "lower bound" without margin_bound


def test_one_colour_per_representation_across_weights_and_figures():
    result = _result()
    palette = plots.palette_of(result)
    for rep in REPS:
        assert palette.line(rep, "pretrained")["color"] == palette.line(rep, "random")["color"]
        assert palette.line(rep, "pretrained")["linestyle"] != palette.line(rep, "random")["linestyle"]
    assert len({palette.color(rep) for rep in REPS}) == len(REPS)
    assert palette.color("random-attention") == RANDOM_ATTENTION_COLOR
    figures = [plots.kruskal_curve, plots.rtol_sweep, plots.depth_fractions, plots.depth_kruskal]
    seen: dict[str, set[str]] = {}
    with figure_style():
        for draw in figures:
            for label, color in _line_colors(draw(result, palette)).items():
                if " @ " in label:
                    seen.setdefault(label.split(" @ ")[0], set()).add(color)
    assert set(seen) == set(REPS)
    assert all(colors == {palette.color(rep)} for rep, colors in seen.items())


def test_depth_colours_follow_the_depth():
    palette = Palette.of(["embedding", "block.0", "block.5", "block.11"])
    assert [depth_of(r) for r in ("embedding", "block.0", "block.11")] == [0, 1, 12]
    assert palette.max_depth == 12
    lum = [np.mean(Image.new("RGB", (1, 1), palette.color(r)).getpixel((0, 0))) for r in
           ("embedding", "block.0", "block.5", "block.11")]
    assert lum == sorted(lum)  # viridis grows lighter with depth
    assert Palette.of(["tokens"]).color("tokens") != Palette.of(["tokens"]).color("random-attention")


def test_context_ranks_are_grouped_bars_not_stacked():
    result = _result()
    with figure_style():
        fig = plots.context_rank_histogram(result)
    ax = fig.axes[0]
    bars = ax.patches
    ranks = sorted(set().union(*(set(r.tolist()) for r in result.context_ranks.values())))
    assert len(bars) == len(result.context_ranks) * len(ranks)
    lefts = [round(b.get_x(), 6) for b in bars]
    assert len(set(lefts)) == len(lefts)  # side by side: no bar hides another
    assert sum(b.get_height() for b in bars) == N * len(result.context_ranks)
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{r} = n" if r == n else str(r) for r in ranks]


def test_margins_say_exact_or_lower_bound_and_the_sweep_marks_k_equal_n():
    result = _result()
    with figure_style():
        margins = plots.margin_histogram(result)
        curve = plots.kruskal_curve(result)
    titles = {ax.get_title() for ax in margins.axes if ax.get_visible()}
    assert "block.1\n(lower bound)" in titles and "block.0\n(exact)" in titles
    curve_labels = [t.get_text() for t in curve.legends[0].get_texts()]
    assert [ax.get_title() for ax in curve.axes if ax.get_visible()] == list(REPS_IN_ORDER)
    assert f"k = n = {n}" in curve_labels and f"k = d = {d}" in curve_labels
    assert "all k-subsets decided" in curve_labels and "others: 50 random k-subsets" in curve_labels


def test_rtol_grid_cells_parse_from_csv_text_and_dicts():
    assert plots.parse_rtol_grid("0.1:1.0;0.2:0.98") == {0.1: 1.0, 0.2: 0.98}
    assert plots.parse_rtol_grid({10: 0.0, 1: 0.5}) == {1.0: 0.5, 10.0: 0.0}
    assert plots.parse_rtol_grid(float("nan")) is None and plots.parse_rtol_grid("") is None


# ---------------------------------------------------------------------------------------------------
# Titles break between phrases; every margin panel has its ticks; off-panel critical rtol: arrow + value
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("draw", [plots.context_rank_histogram, plots.margin_histogram, plots.rtol_sweep])
def test_titles_break_between_phrases_never_inside_one(draw):
    with figure_style():
        fig = draw(_result())
    titles = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    titles += [ax.get_title() for ax in fig.axes]
    for line in (line for title in titles for line in title.split("\n")):
        assert line.count("(") == line.count(")"), (line, titles)  # no parenthesis cut in two
        assert len(line) <= plots.TITLE_WIDTH
    wrapped = plots._title("vit-base", "rank of each context (Assumption 2: rank n)", 240, 197, 768)
    assert wrapped.split("\n")[:2] == ["vit-base: rank of each context", "(Assumption 2: rank n)"]


def test_every_margin_panel_has_its_own_tick_labels():
    with figure_style():
        fig = plots.margin_histogram(_result())
    fig.canvas.draw()
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == len(REPS)
    for ax in shown:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert labels, ax.get_title()


def _critical_rows(critical: float | None, low: float, high: float) -> AuditResult:
    """Every row with the given critical rtol and bracket (multiples of rtol = 1e-6)."""
    result = _result()
    rows = result.rows.assign(critical_rtol=np.nan if critical is None else critical * 1e-6,
                              critical_rtol_low=low * 1e-6, critical_rtol_high=high * 1e-6)
    return AuditResult(rows=rows, curves=result.curves, config=result.config)


@pytest.mark.parametrize(
    "critical, low, high, label",
    [(2e5, 1.9e5, 2.1e5, "2.0e5x"),  # known, far right of the panel
     (None, 0.0, 2.4e-6, "<= 2.4e-06x"),  # only a bracket, wholly left of it
     (0.0, 0.0, 0.0, "0")],  # no tolerance resolves it
)
def test_a_critical_rtol_beyond_the_panel_is_an_arrow_with_its_value_not_a_sliver(critical, low, high, label):
    with figure_style():
        fig = plots.rtol_sweep(_critical_rows(critical, low, high))
    panels = [ax for ax in fig.axes if ax.get_visible()]
    for ax in panels:
        assert label in [t.get_text() for t in ax.texts]
        assert not [line for line in ax.get_lines() if line.get_linewidth() == 3]  # no bracket bar at all
        xlim = ax.get_xlim()
        arrows = [line for line in ax.get_lines() if line.get_marker() in ("<", ">")]
        assert arrows and all(float(line.get_xdata()[0]) in xlim for line in arrows)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "critical rtol off the panel" in legend
