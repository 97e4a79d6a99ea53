"""Every family records the dtype its weights are held in (``weights_dtype``) beside the dtype its tokens are
computed in (``dtype``): tiny checkpoints saved with save_pretrained in bfloat16 and in float32, and random
weights, read back offline; the rows, depth.csv and summary.md of an audit carry both, and a results.csv
written before the column still reads and compares."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import transformers
from conftest import tiny_model, tiny_timm
from test_families import batch_of, tiny_config

from auditor.audit.compare import compare
from auditor.audit.extract import extract
from auditor.audit.report import read_rows
from auditor.audit.runner import AuditConfig, run
from auditor.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

HF_NAMES = ["vit-base", "bert-base", "gpt2"]  # whole models (transformers' from_pretrained)
PARTIAL_TYPES = ["llama", "roberta", "dinov2", "clip_vision_model", "siglip_vision_model"]  # block by block
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _saved(tmp_path, family: str, dtype: torch.dtype):
    """(model name, weights folder, load options) of a tiny checkpoint of ``family`` saved in ``dtype``."""
    folder = tmp_path / f"{family.replace(':', '_')}-{dtype}"
    if family in HF_NAMES:
        tiny_model(family, seed=1).model.to(dtype).save_pretrained(folder)
        return family, str(folder), {}
    if family.startswith("timm:"):
        from safetensors.torch import save_file

        model = tiny_model(family, seed=1).model
        folder.mkdir()
        save_file({k: v.to(dtype).contiguous() for k, v in model.state_dict().items()},
                  str(folder / "model.safetensors"))
        return family, str(folder), {"config_overrides": tiny_timm()}
    config = tiny_config(family, layers=2)
    torch.manual_seed(1)
    transformers.MODEL_MAPPING[type(config)](config).to(dtype).save_pretrained(folder)
    return str(folder), str(folder), {}


@pytest.mark.parametrize("stored", list(DTYPES))
@pytest.mark.parametrize("family", HF_NAMES + PARTIAL_TYPES + ["timm:vit_tiny_patch16_224"])
def test_tokens_name_the_stored_dtype_and_are_computed_in_float32(family, stored, tmp_path):
    if family.startswith("timm:"):
        pytest.importorskip("timm")
    name, weights, options = _saved(tmp_path, family, DTYPES[stored])
    loaded = load_model(name, weights, device="cpu", **options)
    inputs, _ = batch_of(loaded, 2)
    tokens = extract(loaded, inputs, ["embedding"], progress=False)["embedding"]
    assert (tokens.meta["weights_dtype"], tokens.meta["dtype"]) == (stored, "float32")
    assert tokens.contexts.dtype == torch.float32
    if family in HF_NAMES or family.startswith("timm:"):  # random weights of the same architecture
        fresh = tiny_model(family, seed=2)
    else:
        fresh = load_model(name, "random", device="cpu", seed=2)
    tokens = extract(fresh, inputs, ["embedding"], progress=False)["embedding"]
    assert (tokens.meta["weights_dtype"], tokens.meta["dtype"]) == ("float32", "float32")


def test_a_model_object_names_the_dtype_its_parameters_are_in():
    from auditor.models.from_object import from_object

    loaded = from_object(tiny_model("vit-base").model.to(torch.bfloat16))
    assert loaded.details["weights_dtype"] == "bfloat16" and loaded.dtype == torch.bfloat16


@pytest.fixture(scope="module")
def bf16_report(tmp_path_factory):
    """An audit across two depths of a bf16 GPT-2 folder and of random weights, written to a folder."""
    root = tmp_path_factory.mktemp("weights-dtype")
    _, folder, _ = _saved(root, "gpt2", torch.bfloat16)
    config = AuditConfig(model="gpt2", weights=(folder, "random"), samples=24, first=True, subsets=10,
                         layers="0,1", tests=("assumption1", "assumption2"), robustness=False, threads=1,
                         context_length=12, device="cpu")
    return run(config, out=root / "report", progress=False), folder


def test_rows_depth_and_summary_carry_both_dtypes(bf16_report):
    result, folder = bf16_report
    rows = read_rows(result.out / "results.csv")
    by_weights = rows.groupby("weights")["weights_dtype"].agg(set).to_dict()
    assert by_weights == {folder: {"bfloat16"}, "random": {"float32"}}
    assert set(rows["dtype"]) == {"float32"}
    depth = pd.read_csv(result.out / "depth.csv")
    assert depth.groupby("weights")["weights_dtype"].agg(set).to_dict() == by_weights
    assert list(depth.columns).index("weights_dtype") == list(depth.columns).index("dtype") + 1
    summary = (result.out / "summary.md").read_text()
    assert (f"weights_dtype (weights held in): bfloat16 ({folder}), float32 (random); "
            "dtype (tokens computed in): float32;") in summary


def test_a_results_csv_written_before_the_column_still_reads_and_compares(bf16_report, tmp_path):
    result, _ = bf16_report
    old = tmp_path / "old"
    old.mkdir()
    frame = pd.read_csv(result.out / "results.csv", dtype=str)
    frame.drop(columns="weights_dtype").to_csv(old / "results.csv", index=False)
    rows = read_rows(old / "results.csv")
    assert rows["weights_dtype"].isna().all() and len(rows) == len(result.rows)
    pd.testing.assert_frame_equal(rows.drop(columns="weights_dtype"),
                                  read_rows(result.out / "results.csv").drop(columns="weights_dtype"))
    table = compare([str(result.out), str(old)], tmp_path / "cmp", root=tmp_path, plots=False)
    assert len(table) == 2 * len(result.rows)
