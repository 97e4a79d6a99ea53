"""Audits across depth: ``--layers`` parsing, one-pass extraction of every block, the memory bound
(extraction in several passes, one group held at a time) and ``depth.csv``.

Models are tiny random ViTs built from configs (4 blocks, d = 32, n = 17); data are real ImageNet images.
"""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pandas as pd
import pytest
import torch
from conftest import save_tiny_vit, shared_data, tiny_model

from auditor.audit.config import DEFAULT_REPRESENTATIONS, AuditConfig, parse_layers
from auditor.audit.extract import extract, plan_passes, token_bytes
from auditor.audit.plan import AuditPlan
from auditor.audit.report.catalogue import representation_depth
from auditor.audit.report.depth import CRITICAL_COLUMNS, GEOMETRY_COLUMNS, KRANK_COLUMNS, PROVENANCE_COLUMNS
from auditor.audit.runner import run
from auditor.audit.sources import extracted_passes, load_inputs_for
from auditor.cli import main
from auditor.core.errors import AuditError
from auditor.data import load_inputs

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]
BLOCKS = 4


@pytest.fixture(scope="module")
def vit(tmp_path_factory) -> str:
    """A tiny random ViT of 4 blocks saved as a model folder (a model name for the CLI)."""
    return save_tiny_vit(tmp_path_factory.mktemp("tiny-vit-depth"), num_hidden_layers=BLOCKS)


@pytest.fixture(scope="module")
def images() -> str:
    return str(shared_data("imagenet-sample"))


# ---------------------------------------------------------------------------------------------------
# --layers
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "expected"), [
    ("all", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]),
    ("0:6", [0, 1, 2, 3, 4, 5]),  # Python slice semantics: the stop is excluded
    ("-3:", [9, 10, 11]),
    (":2", [0, 1]),
    ("::4", [0, 4, 8]),
    ("0,3,7", [0, 3, 7]),
    ("0:3,11", [0, 1, 2, 11]),
    ("-1, 0, -1", [0, 11]),  # negatives from the end, repeats dropped, sorted
    ("0:100", list(range(12))),  # a slice is clipped like Python's
])
def test_layers_specs_select_blocks_like_python_slices(spec, expected):
    assert parse_layers(spec, 12) == expected


@pytest.mark.parametrize(("spec", "message"), [
    ("12", "layer 12 is out of range: the model has 12 blocks; valid: 0 .. 11"),
    ("-13", "the model has 12 blocks"),
    ("5:2", "layers range '5:2' selects no block of the 12 this model has"),
    ("0:6:0", "layers takes all, block indices"),
    ("block.3", "layers takes all, block indices"),
    ("1-3", "layers takes all, block indices"),
    ("", "layers takes all, block indices"),
    ("0,,", "layers takes all, block indices"),
])
def test_bad_layers_specs_say_what_is_valid(spec, message):
    with pytest.raises(AuditError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_layers(spec, 12)


def test_the_form_is_checked_when_the_config_is_made_and_python_accepts_indices():
    with pytest.raises(AuditError, match="layers takes all"):
        AuditConfig(layers="first three")
    assert AuditConfig(layers="-3:").layers == "-3:"
    with pytest.raises(AuditError, match="memory_budget"):
        AuditConfig(memory_budget=0)


def test_layers_replace_the_default_representations_and_keep_those_asked_for():
    config = AuditConfig(layers="0,2", weights=("random",))
    assert config.representations == DEFAULT_REPRESENTATIONS
    plan = AuditPlan.of(config)
    reps = [r.representation for r in plan.rows]
    assert plan.representations(reps, BLOCKS) == ["embedding", "block.0", "block.2"]
    asked = AuditPlan.of(
        AuditConfig(layers="-2:", representations=("random-attention",), weights=("random",))
    )
    reps = [r.representation for r in asked.rows]
    assert asked.representations(reps, BLOCKS) == ["embedding", "block.2", "block.3", "random-attention"]
    assert AuditPlan.of(AuditConfig()).representations(["block.0"], BLOCKS) == [
        "block.0"
    ]  # no layers: unchanged
    assert [
        representation_depth(r) for r in ("embedding", "random-attention", "block.0", "block.11", "x")
    ] == [0, 0, 1, 12, None]


def test_an_out_of_range_layer_is_refused_before_the_model_loads(vit, images, tmp_path, capsys, monkeypatch):
    import auditor.models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(auditor.models, "load_model", no_loading)
    out = tmp_path / "r"
    code = main([vit, "--data", images, "--layers", "0,7", "--out", str(out), "-q", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert (
        err
        == "error: layer 7 is out of range: the model has 4 blocks; valid: 0 .. 3, or -4 .. -1 from the end\n"
    )
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------
# Extraction: one pass, and several when the memory budget requires
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    loaded = tiny_model("vit-base", num_hidden_layers=BLOCKS)
    return loaded, load_inputs(loaded, None, samples=6, progress=False)  # bundled real photos


def test_one_pass_over_every_block_equals_extracting_each_layer_alone(tiny):
    loaded, inputs = tiny
    every = ["embedding", *(f"block.{i}" for i in range(BLOCKS))]
    together = extract(loaded, inputs, every, batch_size=4, progress=False)
    for rep in every:
        alone = extract(loaded, inputs, [rep], batch_size=4, progress=False)[rep]
        assert torch.equal(together[rep].contexts, alone.contexts), rep  # same process, same batch shapes
        assert torch.equal(together[rep].queries, alone.queries), rep


def test_passes_are_cut_by_depth_within_the_budget():
    reps = ["block.3", "random-attention", "embedding", "block.0", "block.-1"]
    assert plan_passes(reps, BLOCKS, 10, 10**9) == [["block.3", "random-attention", "embedding", "block.0"]]
    assert plan_passes(reps, BLOCKS, 10, 25) == [["random-attention", "embedding"], ["block.0", "block.3"]]
    assert plan_passes(reps, BLOCKS, 10, 1) == [["random-attention"], ["embedding"], ["block.0"], ["block.3"]]
    assert token_bytes(6, 17, 32, torch.float32) == 6 * 18 * 32 * 4


def test_a_small_memory_budget_streams_groups_that_each_fit_and_are_released(tiny):
    loaded, _ = tiny
    every = ["embedding", *(f"block.{i}" for i in range(BLOCKS))]
    plan = AuditPlan.of(AuditConfig(model="vit-base", samples=6, batch_size=4))
    inputs = load_inputs_for(loaded, plan.sampling, None, False).inputs  # the inputs the passes read
    each = token_bytes(inputs.N, loaded.n, loaded.d, loaded.dtype)
    extraction = dataclasses.replace(plan.extraction, memory_budget=2.5 * each / 2**30)  # two layers a pass
    reference = extract(loaded, inputs, every, batch_size=4, progress=False)
    groups = extracted_passes(loaded, every, plan.sampling, extraction, None, False)
    seen, previous = [], None
    for group in groups:
        if previous is not None:
            gc.collect()
            assert previous() is None  # the last group's tokens were freed before this one was made
        assert len(group.items) <= 2
        for item in group.items:
            seen.append(item.representation)
            assert torch.equal(item.contexts, reference[item.representation].contexts)
            assert torch.equal(item.queries, reference[item.representation].queries)
        previous = weakref.ref(group.items[0].contexts)
        del group, item
    assert seen == every


# ---------------------------------------------------------------------------------------------------
# depth.csv
# ---------------------------------------------------------------------------------------------------


def _depth_audit(vit, images, out, **options):
    config = AuditConfig(model=vit, data=images, samples=24, first=True, layers="all", weights=("random",),
                         subsets=60, device="cpu", **options)
    return run(config, out=out, progress=False)


@pytest.fixture(scope="module")
def depth_run(vit, images, tmp_path_factory):
    out = tmp_path_factory.mktemp("depth")
    return _depth_audit(vit, images, out), out


def test_depth_csv_has_one_row_per_layer_in_the_shared_columns(depth_run):
    result, out = depth_run
    depth = result.depth
    assert list(depth["representation"]) == ["embedding", *(f"block.{i}" for i in range(BLOCKS))]
    assert list(depth["depth"]) == list(range(BLOCKS + 1))
    tests = ["assumption1", "assumption2", "assumption3", "general_position"]
    expected = ["model", "weights", "representation", "depth", "N", "n", "d", "rtol",
                *(f"{t}_{c}" for t in tests
                  for c in ("statement", "fraction", "share_meets_threshold", *CRITICAL_COLUMNS)),
                *KRANK_COLUMNS, *GEOMETRY_COLUMNS, *PROVENANCE_COLUMNS]
    assert list(depth.columns) == expected
    written = pd.read_csv(out / "depth.csv")
    assert list(written.columns) == expected and len(written) == BLOCKS + 1
    rows = result.rows
    for _, profile in depth.iterrows():
        mine = rows[rows["representation"] == profile["representation"]].set_index("test")
        for test in tests:
            assert profile[f"{test}_fraction"] == mine.loc[test, "fraction"]
            assert profile[f"{test}_share_meets_threshold"] == mine.loc[test, "share_meets_threshold"]
            assert profile[f"{test}_statement"] == mine.loc[test, "statement"]
            assert profile[f"{test}_critical_rtol_low"] == mine.loc[test, "critical_rtol_low"]
            assert profile[f"{test}_critical_rtol_exact"] == mine.loc[test, "critical_rtol_exact"]
        # the sampled estimate: the largest tested k whose statement no witness refutes
        standing = [int(mine.loc[t, "k"]) for t in ("assumption1", "general_position")
                    if mine.loc[t, "statement"] != "refuted"]
        fails = [int(mine.loc[t, "k"]) for t in ("assumption1", "general_position")
                 if mine.loc[t, "statement"] == "refuted"]
        if profile["krank_exact"]:  # the bounds meet: K itself, never a bound
            assert profile["krank_estimate"] == profile["krank_lower"] == profile["krank_upper"]
            assert profile["krank_sampled"] == f"= {profile['krank_upper']}"
        elif standing:
            assert profile["krank_estimate"] == max(standing)
            assert profile["krank_sampled"] == f">= {max(standing)}"
        else:  # no tested k held: "< k", never 0
            assert pd.isna(profile["krank_estimate"]) and profile["krank_sampled"] == f"< {min(fails)}"
        for column in GEOMETRY_COLUMNS:  # the geometry is the group's: equal on every row of it
            assert mine[column].nunique(dropna=False) == 1 and profile[column] == mine[column].iloc[0]
    embedding = depth.iloc[0]
    # identical CLS tokens: the Kruskal rank is exactly 1 (certified and witnessed), not a sampled 0
    assert not embedding["assumption1_share_meets_threshold"] and embedding["krank_exact"]
    assert embedding["assumption1_statement"] == "refuted"
    assert embedding["krank_estimate"] == embedding["krank_lower"] == embedding["krank_upper"] == 1
    assert embedding["anisotropy"] == pytest.approx(1.0) and embedding["anisotropy_centred"] == 0.0
    assert embedding["stable_rank_centred"] == 0.0  # nothing is left of identical tokens once centred
    a2 = rows[rows["test"] == "assumption2"]  # every context tested: the interval is the share itself
    assert (a2["fraction_low"] == a2["fraction"]).all() and (a2["fraction_high"] == a2["fraction"]).all()


def test_kruskal_rows_carry_an_interval_and_bounds_that_bracket_the_estimate(depth_run):
    bounds = pytest.importorskip("probes.bounds")
    result, _ = depth_run
    rows = result.rows[result.rows["test"].isin(["assumption1", "assumption3", "general_position"])]
    assert (rows["fraction_low"] <= rows["fraction"]).all() and (
        rows["fraction"] <= rows["fraction_high"]
    ).all()
    assert rows["krank_lower_method"].isin(bounds.METHODS).all()
    witnessed = rows["witness"].map(lambda w: w is not None)
    assert rows.loc[witnessed, "krank_upper"].notna().all()
    assert (rows.loc[witnessed, "krank_upper"] <= rows.loc[witnessed, "k"] - 1).all()
    assert (rows["krank_lower"] <= rows["krank_upper"].fillna(rows["d"])).all()
    depth = result.depth
    certain = depth["krank_upper"].notna()
    assert (depth.loc[certain, "krank_lower"] <= depth.loc[certain, "krank_upper"]).all()
    embedding = result.rows[
        (result.rows["representation"] == "embedding") & (result.rows["test"] == "assumption1")
    ]
    assert int(embedding["duplicates"].iloc[0]) == 23  # 24 identical CLS tokens: 23 repeat an earlier one


def test_a_tiny_memory_budget_gives_the_same_rows_and_depth(depth_run, vit, images, tmp_path):
    result, _ = depth_run
    streamed = _depth_audit(vit, images, tmp_path / "r", memory_budget=1e-9)  # one layer per pass
    drop = ["seconds", "git_commit"]
    # exact: the same batches through the same blocks, reduced on the blocks one in-memory call cuts
    pd.testing.assert_frame_equal(streamed.rows.drop(columns=drop), result.rows.drop(columns=drop))
    pd.testing.assert_frame_equal(
        streamed.depth.drop(columns="git_commit"), result.depth.drop(columns="git_commit")
    )
    stages = set(streamed.stages["stage"])
    assert {
        "assumption1 (block.3)",
        "geometry (embedding)",
        "extraction @ random",
    } <= stages  # each layer's tests


def test_a_rerun_into_a_finished_report_reuses_rows_and_writes_the_same_depth_csv(vit, images, tmp_path):
    out = tmp_path / "r"
    first = _depth_audit(vit, images, out)
    before = (out / "depth.csv").read_text()
    again = _depth_audit(vit, images, out)
    reused = again.rows["note"].astype(str).str.contains("reused from")
    assert reused.sum() == 3 * (BLOCKS + 1)  # every Kruskal row of every layer
    assert (out / "depth.csv").read_text() == before
    pd.testing.assert_frame_equal(again.depth, first.depth)


def test_no_depth_profile_for_an_audit_of_one_block(vit, images, tmp_path):
    config = AuditConfig(
        model=vit,
        data=images,
        samples=20,
        first=True,
        representations=("embedding", "block.0"),
        weights=("random",),
        tests=("assumption1",),
        subsets=20,
        device="cpu",
    )
    result = run(config, out=tmp_path / "r", progress=False)
    assert result.depth.empty and not (tmp_path / "r" / "depth.csv").exists()
    assert "assumption1" in set(result.stages["stage"])
