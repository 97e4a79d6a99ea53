"""Placing the embedding and audited blocks on GPUs (auditor.models.placement): the plan is a pure function of
sizes and free memory, tested here without a GPU; the dispatch itself runs only where CUDA is."""

from __future__ import annotations

import pytest
import torch
from test_families import batch_of, save, tiny_config

from auditor.audit.extract import extract
from auditor.core.errors import AuditError
from auditor.models import load_model
from auditor.models import partial_adapter as partial_adapter_module
from auditor.models.decoder import DECODER
from auditor.models.partial import cut_config, parameters_on_meta
from auditor.models.placement import (
    BEFORE_BLOCKS,
    GIB,
    HEADROOM,
    device_of,
    move_to_plan,
    plan_placement,
    unit_sizes,
)


def test_plan_fills_each_gpu_in_forward_order_then_the_next():
    units = [(BEFORE_BLOCKS, 2 * GIB), ("block.0", 3 * GIB), ("block.1", 3 * GIB), ("block.2", 3 * GIB)]
    one = plan_placement(units, [("cuda:0", 80 * GIB), ("cuda:1", 80 * GIB)])
    assert set(one.values()) == {"cuda:0"}  # fits one GPU: no split
    room = int(7 * GIB / HEADROOM) + 1  # 7 GiB for weights on each: 2 + 3 fit, 2 + 3 + 3 do not
    split = plan_placement(units, [("cuda:0", room), ("cuda:1", room)])
    assert split == {BEFORE_BLOCKS: "cuda:0", "block.0": "cuda:0", "block.1": "cuda:1", "block.2": "cuda:1"}
    # a later unit never goes back to an earlier device, so a forward pass crosses each boundary once
    order = plan_placement(
        [("a", 5), ("b", 50), ("c", 5)], [("cuda:0", int(60 / HEADROOM)), ("cuda:1", 1000)]
    )
    assert order == {"a": "cuda:0", "b": "cuda:0", "c": "cuda:1"}


def test_plan_that_does_not_fit_says_what_to_do():
    units = [(BEFORE_BLOCKS, 2 * GIB), ("block.0", 30 * GIB)]
    with pytest.raises(
        AuditError,
        match=r"need 32\.0 GiB but 1 GPU\(s\) have 18\.0 GiB .*block\.0 did not fit.*"
        r"--device cpu",
    ) as err:
        plan_placement(units, [("cuda:0", 20 * GIB)])
    assert "\n" not in str(err.value)
    with pytest.raises(AuditError, match="no GPU"):
        plan_placement(units, [])


def test_unit_sizes_count_the_cut_model_in_the_compute_dtype():
    config = tiny_config("llama", layers=3)
    with parameters_on_meta():
        net = DECODER._instantiate(cut_config(config, 2))
    blocks = DECODER.blocks_of(net, config)
    units = dict(unit_sizes(net, blocks, 2, torch.float32))
    block = sum(p.numel() for p in blocks[0].parameters()) * 4
    assert units["block.0"] == units["block.1"] == block and "block.2" not in units
    halves = dict(unit_sizes(net, blocks, 2, torch.bfloat16))
    assert halves["block.0"] * 2 == block
    total = sum(p.numel() for p in net.parameters()) * 4 + sum(
        b.numel() * b.element_size() for b in net.buffers()
    )
    assert sum(units.values()) == total  # nothing counted twice or missed
    plan = {BEFORE_BLOCKS: "cuda:0", "block.0": "cuda:0", "block.1": "cuda:1"}
    assert device_of("layers.1.mlp.up_proj.weight", "layers", plan) == "cuda:1"
    assert (
        device_of("embed_tokens.weight", "layers", plan)
        == device_of("norm.weight", "layers", plan)
        == "cuda:0"
    )


def test_move_to_plan_keeps_meta_placeholders_and_places_the_rest(tmp_path):
    config = tiny_config("llama", layers=2)
    with parameters_on_meta():
        net = DECODER._instantiate(cut_config(config, 2))
    net.layers[0].mlp.up_proj.weight = torch.nn.Parameter(torch.ones(128, 64), requires_grad=False)
    move_to_plan(net, "layers", {BEFORE_BLOCKS: "cpu"})
    assert net.layers[0].mlp.up_proj.weight.device.type == "cpu" and net.layers[1].mlp.up_proj.weight.is_meta


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_blocks_split_between_the_gpu_and_the_cpu_give_the_cpu_tokens(tmp_path, monkeypatch):
    """With room on the GPU for the embedding and block 0 only, block 1 goes to the next device (the CPU here,
    another GPU in use): accelerate's hooks carry the hidden states and the tokens equal the CPU run's."""
    pytest.importorskip("accelerate")
    config = tiny_config("llama", layers=3)
    folder = str(tmp_path / "llama")
    save(config, folder)
    cpu = load_model(folder, folder, device="cpu")
    inputs, _ = batch_of(cpu)
    want = extract(cpu, inputs, ["block.0", "block.1"], progress=False)
    with parameters_on_meta():
        net = DECODER._instantiate(cut_config(config, 2))
    sizes = unit_sizes(net, DECODER.blocks_of(net, config), 2, torch.float32)
    room = int((sizes[0][1] + sizes[1][1]) / HEADROOM) + 1
    monkeypatch.setattr(
        partial_adapter_module, "gpu_free", lambda device: [("cuda:0", room), ("cpu", 1 << 40)]
    )
    split = load_model(folder, folder, device="cuda")
    got = extract(split, inputs, ["block.0", "block.1"], progress=False)
    assert "block.0 on cuda:0, block.1 on cpu" in split.details["placement"]
    for rep in ("block.0", "block.1"):
        assert torch.allclose(got[rep].contexts, want[rep].contexts, rtol=1e-4, atol=1e-5), rep
