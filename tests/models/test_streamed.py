"""Weights read when their module runs (auditor.models.streamed): the same tokens as resident weights, and
nothing big left in memory between batches."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import forward_atol
from safetensors.torch import load_file, save_file
from test_families import batch_of, save, tiny_config

from auditor.audit.extract import extract
from auditor.core.errors import AuditError
from auditor.models import load_model
from auditor.models import streamed as streamed_module
from auditor.models.partial_adapter import PartialAdapter
from auditor.models.streamed import SafetensorsFile

pytestmark = pytest.mark.usefixtures("one_thread")


def test_safetensors_reads_whole_tensors_in_chunks_and_single_rows(tmp_path, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "table": torch.randn(50, 7, generator=gen).to(torch.bfloat16),
        "ids": torch.arange(5),
        "half": torch.randn(3, 4, 5, generator=gen).to(torch.float16),
    }
    save_file(tensors, tmp_path / "t.safetensors")
    monkeypatch.setattr(streamed_module, "CHUNK_BYTES", 6)  # 3 bf16 values per read: many partial chunks
    file = SafetensorsFile(tmp_path / "t.safetensors")
    assert torch.equal(file.tensor("table", torch.float32), tensors["table"].float())
    assert torch.equal(file.tensor("half", torch.float64), tensors["half"].double())
    assert torch.equal(file.tensor("ids", torch.float32), tensors["ids"])  # integers keep their dtype
    ids = torch.tensor([0, 3, 4, 49])
    assert torch.equal(file.rows("table", ids, torch.float32), tensors["table"][ids].float())
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "t.safetensors").read_bytes()[:-40])
    with pytest.raises(AuditError, match="not a readable safetensors file .*file not fully covered"):
        SafetensorsFile(tmp_path / "cut.safetensors")  # the library's header check: refused before a read


@pytest.mark.parametrize("chunk", [None, 1000])
@pytest.mark.parametrize("model_type", ["llama", "gemma2", "deberta-v2", "clip_vision_model"])
def test_streamed_tokens_equal_resident_ones_and_no_weight_stays(model_type, chunk, tmp_path, monkeypatch):
    """A bf16 checkpoint audited with streamed weights (the CPU default) and with resident ones (as on a GPU):
    the same tokens (identical when a linear layer's weight is read in one chunk; equal up to float32
    rounding in chunks of 3 rows); between batches the streamed net holds no linear weight and no
    embedding row."""
    if chunk is not None:
        monkeypatch.setattr(streamed_module, "CHUNK_BYTES", chunk)  # 1000 bytes: 3 float32 rows of 64
    config = tiny_config(model_type)
    folder = tmp_path / model_type
    torch.manual_seed(0)
    transformers.MODEL_MAPPING[type(config)](config).to(torch.bfloat16).save_pretrained(folder)
    streamed = load_model(str(folder), str(folder), device="cpu")
    inputs, _ = batch_of(streamed, 6)
    reps = ["embedding", "block.0", "block.2"]
    got = extract(streamed, inputs, reps, progress=False, batch_size=4)
    assert "streamed" in streamed.details["loading"]
    net = streamed.model.net
    linears = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.is_meta for m in linears)
    if streamed.modality == "text":
        assert net.get_input_embeddings().weight.is_meta
    monkeypatch.setattr(PartialAdapter, "streams", lambda self, device, reader: False)
    resident = load_model(str(folder), str(folder), device="cpu")
    want = extract(resident, inputs, reps, progress=False, batch_size=4)
    assert "streamed" not in resident.details["loading"]
    blocks = resident.adapter.blocks(resident.model)
    assert not any(p.is_meta for p in blocks.parameters())  # resident: placed once, real
    for rep in reps:
        a, b = got[rep].contexts, want[rep].contexts
        assert (
            torch.equal(a, b) if chunk is None else torch.allclose(a, b, rtol=0, atol=forward_atol(b, 64))
        ), rep
    assert streamed.model.reader.weights_dtype == resident.model.reader.weights_dtype == "bfloat16"


def test_streamed_weights_are_dropped_when_the_forward_stops_early(tmp_path):
    """The extractor stops the forward pass by raising inside a block: the weights read are dropped anyway,
    and a NaN in a streamed weight is reported when it is read."""
    folder = tmp_path / "llama"
    save(tiny_config("llama"), folder)
    shard = folder / "model.safetensors"
    tensors = load_file(shard)
    tensors["layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(tensors, shard, metadata={"format": "pt"})
    loaded = load_model(str(folder), str(folder), device="cpu")
    inputs, _ = batch_of(loaded)
    extract(loaded, inputs, ["block.0"], progress=False)  # stops inside the model, after block 0
    assert all(
        p.is_meta
        for m in loaded.model.net.modules()
        if isinstance(m, torch.nn.Linear)
        for p in m.parameters()
    )
    with pytest.raises(AuditError, match=r"'layers\.1\.mlp\.up_proj\.weight' contains NaN"):
        extract(loaded, inputs, ["block.1"], progress=False)


def test_pickled_checkpoint_is_read_whole_and_gives_the_same_tokens(tmp_path):
    """A pytorch_model.bin cannot be read tensor by tensor: its weights are placed once (not streamed), with
    the same tokens as the safetensors copy."""
    folder = tmp_path / "st"
    model = save(tiny_config("qwen2"), folder)
    pickled = tmp_path / "bin"
    pickled.mkdir()
    (pickled / "config.json").write_text((folder / "config.json").read_text())
    torch.save(model.state_dict(), pickled / "pytorch_model.bin")
    streamed = load_model(str(folder), str(folder), device="cpu")
    whole = load_model(str(pickled), str(pickled), device="cpu")
    inputs, _ = batch_of(streamed)
    a = extract(streamed, inputs, ["embedding", "block.1"], progress=False)
    b = extract(whole, inputs, ["embedding", "block.1"], progress=False)
    assert "streamed" in streamed.details["loading"] and "streamed" not in whole.details["loading"]
    for rep in ("embedding", "block.1"):
        assert torch.equal(a[rep].contexts, b[rep].contexts), rep  # same weights, batches, kernels, process
