"""Every figure of an audit across depth (``--layers all``, with a sweep) on a tiny random ViT, rendered
and measured: the axes keep most of the canvas (no legend squeezing them to a sliver) and no text leaves
the canvas (no clipped label, title or tick). The same checks on the figures of ``audit compare``.

Two sizes: the default tier renders a minute report (4 blocks: with the embedding 5 representations: every
figure takes its many-representation layout; 8 images of 5 tokens, 5 subsets per test), the slow tier the
larger one (4 blocks, 20 images of 17 tokens, 20 subsets)."""

from __future__ import annotations

import pytest
from conftest import save_tiny_vit, shared_data

from auditor.audit.config import AuditConfig
from auditor.audit.report import plots
from auditor.audit.report.style import DPI, figure_style
from auditor.audit.runner import run

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]
MIN_AXES_SHARE = 0.3  # of the canvas, for the union of the panels (legend and titles take the rest)
# (ViT config overrides, images, subsets per test, sweep k): n = 1 + (image_size / patch_size)^2 tokens
SIZES = {
    "small": (dict(num_hidden_layers=4, hidden_size=16, num_attention_heads=2, intermediate_size=32,
                   image_size=16), 8, 5, (2, 5, 8)),
    "large": (dict(num_hidden_layers=4), 20, 20, (2, 17, 20)),  # about 30 s on a shared 2-core machine
}


@pytest.fixture(scope="module", params=[pytest.param("small"), pytest.param("large", marks=pytest.mark.slow)])
def depth_report(request, tmp_path_factory):
    """A --layers all audit with a sweep: embedding, random-attention and every block, random weights."""
    overrides, samples, subsets, ks = SIZES[request.param]
    folder = save_tiny_vit(tmp_path_factory.mktemp("tiny-vit-figures"), **overrides)
    out = tmp_path_factory.mktemp("figures")
    config = AuditConfig(
        model=str(folder),
        data=str(shared_data("imagenet-sample")),
        samples=samples,
        first=True,
        layers="all",
        weights=("random",),
        subsets=subsets,
        sweep=True,
        sweep_ks=ks,
        sweep_subsets=subsets,
        sweep_refine=0,
        device="cpu",
    )
    result = run(config, out=out, progress=False)
    assert result.depth["representation"].nunique() > plots.MANY_REPRESENTATIONS  # the panel layouts
    return result, out


def layout_problems(fig) -> list[str]:
    """What would not print: panels squeezed below :data:`MIN_AXES_SHARE` of the canvas, text outside it."""
    fig.set_dpi(DPI)  # text is measured as it is saved: glyph widths depend on the resolution
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    problems = []
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
    x0, y0 = min(b.x0 for b in boxes), min(b.y0 for b in boxes)
    x1, y1 = max(b.x1 for b in boxes), max(b.y1 for b in boxes)
    share = (x1 - x0) * (y1 - y0) / (canvas.width * canvas.height)
    if share < MIN_AXES_SHARE:
        problems.append(f"panels take {share:.0%} of the canvas")
    drawn = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible()]  # ticks, labels, titles
    drawn += [artist.get_window_extent(renderer) for artist in (*fig.legends, *fig.texts, fig._suptitle,
                                                                 fig._supxlabel, fig._supylabel)
              if artist is not None and artist.get_visible()]
    for box in drawn:
        if box.x0 < canvas.x0 or box.y0 < canvas.y0 or box.x1 > canvas.x1 or box.y1 > canvas.y1:
            problems.append(f"something drawn at {box.bounds} leaves the canvas {canvas.bounds}")
    return problems


def test_every_figure_of_an_audit_across_depth_prints(depth_report):
    result, out = depth_report
    names = [name for name, _ in plots.applicable_plots(result)]
    assert names == list(plots.PLOT_FILES)  # every figure applies to this report
    palette = plots.palette_of(result)
    for name, draw in plots.applicable_plots(result):
        with figure_style():
            fig = draw(result, palette)
        try:
            assert layout_problems(fig) == [], name
        finally:
            import matplotlib.pyplot as plt

            plt.close(fig)
        assert (out / name).is_file() and (out / name).with_suffix(".pdf").read_bytes().startswith(b"%PDF")


def test_depth_kruskal_draws_the_proven_interval_never_a_zero(depth_report):
    result, _ = depth_report
    depth = result.depth
    embedding = depth[depth["representation"] == "embedding"].iloc[0]
    assert embedding["krank_exact"] and embedding["krank_sampled"] == "= 1"  # identical CLS tokens
    with figure_style():
        fig = plots.depth_kruskal(result)
    ys = [y for line in fig.axes[0].get_lines() for y in line.get_ydata()]
    assert min(ys) >= 1  # no point at 0: the rank is a bound or known, never a sampled 0


def test_margin_panels_of_two_weights_with_different_kinds_keep_their_titles_inside(depth_report):
    """A panel whose weights sources have margins of different kinds (pretrained exact, random a lower
    bound, as in MiniLM's blocks 3-4) names each on its own line, inside the canvas."""
    import dataclasses

    import matplotlib.pyplot as plt
    import pandas as pd

    result, _ = depth_report
    rows = result.rows
    twin = rows.assign(weights="pretrained", margin_bound=~rows["margin_bound"].astype(bool))
    both = dataclasses.replace(
        result, rows=pd.concat([rows, twin], ignore_index=True),
        margins={**result.margins, **{label.replace("@random", "@pretrained"): m
                                      for label, m in result.margins.items()}})
    with figure_style():
        fig = plots.margin_histogram(both)
    try:
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert any("pretrained: " in t and "\nrandom: " in t for t in titles), titles
        assert layout_problems(fig) == []
    finally:
        plt.close(fig)


def test_the_figures_of_compare_print(depth_report, tmp_path):
    from auditor.audit.compare import compare

    _, out = depth_report
    compare([out, out], tmp_path / "cmp", root=tmp_path)
    import matplotlib.pyplot as plt
    import pandas as pd

    from auditor.audit.compare import compare_table
    from auditor.audit.report.compare_plots import depth_overlay, kruskal_by_test

    for draw in (lambda: depth_overlay({"tiny": pd.read_csv(out / "depth.csv")}),
                 lambda: kruskal_by_test(compare_table([_report(out)]), {str(out): "tiny"})):
        with figure_style():
            fig = draw()
        try:
            assert layout_problems(fig) == []
        finally:
            plt.close(fig)
    for name in ("compare_kruskal", "compare_depth"):
        assert (tmp_path / "cmp" / f"{name}.png").is_file() and (tmp_path / "cmp" / f"{name}.pdf").is_file()


def _report(folder):
    from auditor.audit.compare import Report

    return Report(folder, "tiny")
