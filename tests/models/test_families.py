"""The families loaded block by block (decoder LLMs, RoBERTa/DeBERTa/ModernBERT, DINOv2, CLIP, SigLIP):
tiny random configs saved with save_pretrained and read back through the real loading path, offline."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from conftest import forward_atol
from safetensors.torch import load_file, save_file

from auditor.audit.extract import extract
from auditor.audit.plan import AuditPlan
from auditor.audit.runner import AuditConfig, run
from auditor.core.errors import AuditError
from auditor.data import load_inputs
from auditor.models import WeightsUnavailable, known_models, load_model, resolve
from auditor.models.devices import check_precision
from auditor.models.partial import cut_config, parameters_on_meta
from auditor.models.partial_adapter import PartialAdapter
from auditor.models.registry import adapters

pytestmark = pytest.mark.usefixtures("one_thread")


def _partial_adapters() -> list[PartialAdapter]:
    """Every family loaded block by block, read from the registry (a family added there is tested here)."""
    return [a for a in dict.fromkeys(adapters().values()) if isinstance(a, PartialAdapter)]


def _one_tower(model_type: str) -> bool:
    """Whether a config of ``model_type`` is one network (a two-tower CLIP/SigLIP config is tested alone)."""
    return "vision_config" not in getattr(transformers.CONFIG_MAPPING[model_type], "sub_configs", {})


NEW_NAMES = [name for name in known_models() if isinstance(resolve(name).adapter, PartialAdapter)]
TEXT_TYPES = [t for a in _partial_adapters() if a.modality == "text" for t in a.model_types]
VISION_TYPES = [t for a in _partial_adapters() if a.modality == "image"
                for t in a.model_types if _one_tower(t)]
VOCAB = 512


def tiny_config(model_type: str, layers: int = 3, **overrides):
    """A 64-wide config of ``model_type`` with ``layers`` blocks (special ids inside a 512-id vocabulary)."""
    fields = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
    }
    if model_type in VISION_TYPES:
        fields.update(image_size=32, patch_size=8)
    else:
        fields.update(vocab_size=VOCAB, max_position_embeddings=130)
    config = transformers.CONFIG_MAPPING[model_type](**fields)
    if hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = 2
    if model_type in ("gemma", "gemma2", "gemma3_text", "qwen3"):
        config.head_dim = 16
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "cls_token_id", "sep_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value >= VOCAB:
            setattr(config, key, {"pad_token_id": 0, "bos_token_id": 1}.get(key, 2))
    if model_type == "modernbert":
        config.local_attention = 16
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def save(config, folder, **kwargs):
    """Random weights (seed 0) of the base model of ``config``, saved with save_pretrained (safetensors)."""
    torch.manual_seed(0)
    model = transformers.MODEL_MAPPING[type(config)](config).eval()
    model.save_pretrained(folder, **kwargs)
    return model


def batch_of(loaded, num: int = 4):
    inputs = load_inputs(loaded, None, num, progress=False, first=True)
    return inputs, next(inputs.batches(num))


def reference_states(model, loaded, batch):
    """hidden_states of the whole model (the library's own forward), with the adapter's inputs."""
    if loaded.modality == "image":
        kwargs = {"pixel_values": batch["pixel_values"]}
    else:
        ids = batch["input_ids"].clone()
        if loaded.model.state.get("bos_id") is not None:
            ids[:, 0] = loaded.model.state["bos_id"]
        kwargs = {"input_ids": ids}
    with torch.inference_mode():
        return model(**kwargs, output_hidden_states=True).hidden_states


# --- the registry contract ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW_NAMES)
def test_every_new_name_builds_at_its_real_width(name):
    """The architecture in code builds at the real width (parameters on the meta device, no memory) and the
    default n fits in the width."""
    spec = resolve(name)
    config = spec.config()
    adapter = spec.adapter
    assert isinstance(adapter, PartialAdapter)
    with parameters_on_meta():
        net = adapter._instantiate(cut_config(adapter.tower(config), 1))
    blocks = net
    for attr in adapter.block_path_of(adapter.tower(config)).split("."):
        blocks = getattr(blocks, attr)
    assert len(blocks) == 1
    n, d = adapter.planned_shape(spec, "random", context_length=None, overrides=None)
    assert n <= d and ("n = " not in spec.description or f"n = {n}" in spec.description)
    assert name in known_models()


def test_every_family_loads_through_the_one_recipe():
    """No family writes its own load: each fills the steps of Adapter.load (timm's build_model_with_cfg
    pattern), and reports its context limits instead of choosing a default n."""
    from auditor.models.base import Adapter, ContextLimits
    from auditor.models.timm_vit import TIMM_VIT

    families = [*dict.fromkeys(adapters().values()), TIMM_VIT]
    assert len(families) >= 9
    for adapter in families:
        assert type(adapter).load is Adapter.load, adapter.family
        assert type(adapter).context_length is Adapter.context_length, adapter.family
        assert type(adapter).context_limits is not Adapter.context_limits, adapter.family
    for name in known_models():
        spec = resolve(name)
        assert isinstance(spec.adapter.context_limits(spec.config()), ContextLimits)


# The n of an audit with no options, chosen by the plan's one cost rule from what the adapters report:
# the decoders' own n is 128, and their blocks' weights (grouped-query attention, gated MLPs) halve it.
DECODER_DEFAULT_N = {"llama-3.2-1b": 128, "qwen2.5-0.5b": 128, "qwen3-0.6b": 128, "gemma-2-2b": 64,
                     "phi-3-mini": 64, "mistral-7b": 32, "llama-3.1-8b": 32}


@pytest.mark.parametrize("name", sorted(DECODER_DEFAULT_N))
def test_the_plan_halves_a_decoder_s_own_n_by_the_weights_of_its_block(name):
    from auditor.audit.config import MAX_DEFAULT_SAMPLES
    from auditor.audit.plan import DEFAULT_COST, audit_flops, default_context_length
    from auditor.data import default_samples

    def cost(n: int) -> float:  # of the audit with no options at this n
        return audit_flops(default_samples(n, None, MAX_DEFAULT_SAMPLES), n, d, block=limits.block_weights)

    spec = resolve(name)
    config, adapter = spec.config(), spec.adapter
    limits = adapter.context_limits(config)
    assert limits.fixed is None and adapter.context_length(config, None) == 128  # the family's own n
    n = AuditPlan.of(AuditConfig()).context_length(spec, "random")
    assert n == DECODER_DEFAULT_N[name]
    assert n == default_context_length(128, adapter.width(config), block=limits.block_weights)
    d = adapter.width(config)
    assert cost(n) <= DEFAULT_COST.flops and (n == 128 or cost(2 * n) > DEFAULT_COST.flops)


def test_named_architectures_match_the_published_shapes():
    fields = {
        "llama-3.1-8b": {
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
        },
        "llama-3.2-1b": {"hidden_size": 2048, "num_hidden_layers": 16, "tie_word_embeddings": True},
        "qwen2.5-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_key_value_heads": 2},
        "qwen3-0.6b": {"hidden_size": 1024, "num_hidden_layers": 28, "head_dim": 128},
        "mistral-7b": {"hidden_size": 4096, "intermediate_size": 14336, "sliding_window": 4096},
        "gemma-2-2b": {"hidden_size": 2304, "num_hidden_layers": 26, "head_dim": 256, "vocab_size": 256000},
        "phi-3-mini": {"hidden_size": 3072, "num_hidden_layers": 32, "vocab_size": 32064},
        "dinov2-reg-base": {"hidden_size": 768, "patch_size": 14, "num_register_tokens": 4},
        "siglip-base": {"hidden_size": 768, "patch_size": 16, "image_size": 224},
    }
    for name, expected in fields.items():
        config = resolve(name).config()
        assert {k: getattr(config, k) for k in expected} == expected, name


@pytest.mark.parametrize("width", [pytest.param(4096, marks=pytest.mark.slow), 256])
def test_random_8b_builds_only_the_audited_blocks(width):
    """llama-3.1-8b with random weights: the model an audit of block 0 holds has the embedding and ONE block
    of its 32 (at the real width, slow; and at a narrow width with the real depth)."""
    narrow = (
        {} if width == 4096 else {"hidden_size": width, "intermediate_size": 512, "head_dim": width // 32}
    )
    loaded = load_model(
        "llama-3.1-8b", "random", device="cpu", config_overrides={"vocab_size": 1024, **narrow}
    )
    assert (loaded.num_layers, loaded.d) == (32, width)
    if width == 4096:
        assert (loaded.n, loaded.query_index) == (128, 127)  # its own n; the plan chooses the audit's:
        assert AuditPlan.of(AuditConfig()).context_length(resolve("llama-3.1-8b"), "random") == 32
    assert loaded.model.net is None  # nothing is built before the extractor says how deep it reads
    loaded.adapter.prepare(loaded.model, 0)
    assert len(loaded.adapter.blocks(loaded.model)) == 1
    block = sum(p.numel() for p in loaded.model.net.layers[0].parameters())
    params = sum(p.numel() for p in loaded.model.parameters())
    assert params == 1024 * width + block + width  # embedding + one block + the final norm, not 32 blocks


# --- random weights: the same numbers as the whole model ---------------------------------------------


@pytest.mark.parametrize("model_type", TEXT_TYPES + VISION_TYPES)
def test_partial_model_gives_the_whole_models_hidden_states(model_type, tmp_path):
    """Tokens of the cut model (block 0 only, then grown to block 1) equal the whole saved model's
    hidden_states[0..2] on the same inputs, read back from a save_pretrained folder."""
    config = tiny_config(model_type)
    folder = tmp_path / model_type
    full = save(config, folder)
    loaded = load_model(str(folder), str(folder), device="cpu")
    inputs, batch = batch_of(loaded)
    first = extract(loaded, inputs, ["embedding", "block.0"], progress=False, batch_size=4)
    assert loaded.weights == str(folder) and loaded.details["weights_dtype"] == "float32"
    assert loaded.model.weighted == 1
    deeper = extract(loaded, inputs, ["block.1"], progress=False, batch_size=4)
    assert loaded.model.weighted == 2
    states = reference_states(full, loaded, batch)
    for name, index, tokens in (("embedding", 0, first), ("block.0", 1, first), ("block.1", 2, deeper)):
        got, want = tokens[name].contexts, states[index]
        assert got.shape == want.shape
        assert torch.allclose(got, want, rtol=0, atol=forward_atol(want, 64)), (model_type, name)
    expected = "mean" if loaded.query == "mean" else str(loaded.query_index)  # SigLIP: the patch mean
    assert first["block.0"].meta["query_index"] == expected


def test_random_weights_do_not_depend_on_the_depth_built(monkeypatch):
    """Block 0 is the same whether the audit reads block 0 or block 2 (modules are initialised in order)."""
    from auditor.models import ModelSpec, register, registry
    from auditor.models.decoder import DECODER

    monkeypatch.setattr(registry, "_MODELS", dict(registry._MODELS))  # the name is gone after the test

    config = tiny_config("llama", layers=4)
    register(
        ModelSpec("test-tiny-llama-depth", DECODER, "none", lambda: cut_config(config, 4), "tiny; n = 32")
    )
    a = load_model("test-tiny-llama-depth", "random", device="cpu", seed=3)
    b = load_model("test-tiny-llama-depth", "random", device="cpu", seed=3)
    inputs, _ = batch_of(a)
    shallow = extract(a, inputs, ["block.0"], progress=False)
    deep = extract(b, inputs, ["block.0", "block.2"], progress=False)
    # same process, same batch: block 0 runs the same kernels whether the forward stops after it or not
    assert torch.equal(shallow["block.0"].contexts, deep["block.0"].contexts)


# --- the partial loader reads only what it audits -----------------------------------------------------


def test_sharded_checkpoint_reads_only_the_audited_blocks_and_ignores_corrupt_deeper_ones(tmp_path):
    folder = tmp_path / "llama"
    save(tiny_config("llama", layers=4), folder, max_shard_size="60KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2  # sharded
    # block 2's tensors become NaN and block 3's disappear: a whole-model load would fail on either
    for shard in sorted(set(index["weight_map"].values())):
        tensors = load_file(folder / shard)
        kept = {
            k: (torch.full_like(v, math.nan) if ".layers.2." in f".{k}" else v)
            for k, v in tensors.items()
            if ".layers.3." not in f".{k}"
        }
        save_file(kept, folder / shard, metadata={"format": "pt"})
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if ".layers.3." not in f".{k}"}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    loaded = load_model(str(folder), str(folder), device="cpu")
    inputs, _ = batch_of(loaded)
    tokens = extract(loaded, inputs, ["embedding", "block.0", "block.1"], progress=False)
    read = loaded.model.reader.read_keys
    assert read and not any(k.startswith(("layers.2.", "layers.3.", "norm.")) for k in read)
    assert {k.split(".")[1] for k in read if k.startswith("layers.")} == {"0", "1"}
    assert torch.isfinite(tokens["block.1"].contexts).all()
    with pytest.raises(AuditError, match=r"'layers\.2\..*' contains NaN or infinite values"):
        extract(loaded, inputs, ["block.2"], progress=False)
    fresh = load_model(str(folder), str(folder), device="cpu")
    with pytest.raises(WeightsUnavailable, match="lacks .* tensors the audit needs"):
        extract(fresh, inputs, ["block.3"], progress=False)


def test_embedding_only_reads_no_block(tmp_path):
    folder = tmp_path / "qwen"
    save(tiny_config("qwen2"), folder)
    loaded = load_model(str(folder), str(folder), device="cpu")
    inputs, _ = batch_of(loaded)
    extract(loaded, inputs, ["embedding"], progress=False)
    assert loaded.model.reader.read_keys == ["embed_tokens.weight"]


def test_two_tower_clip_checkpoint_reads_the_vision_tower_only(tmp_path):
    vision = tiny_config("clip_vision_model")
    text = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64,
            "vocab_size": 100}
    config = transformers.CLIPConfig(vision_config=vision.to_dict(), text_config=text)
    torch.manual_seed(0)
    transformers.CLIPModel(config).save_pretrained(tmp_path / "clip")
    loaded = load_model(str(tmp_path / "clip"), str(tmp_path / "clip"), device="cpu")
    assert (loaded.family, loaded.n, loaded.d) == ("clip", 17, 64)
    inputs, _ = batch_of(loaded)
    extract(loaded, inputs, ["block.0"], progress=False)
    read = loaded.model.reader.read_keys
    assert read and all(k.startswith("vision_model.") for k in read)
    assert not any("post_layernorm" in k or "layers.1." in k for k in read)


# --- precision: weights in bf16, tokens in float32 -----------------------------------------------------


def test_bf16_checkpoint_is_computed_in_float32_and_says_both(tmp_path):
    config = tiny_config("mistral")
    config.dtype = torch.bfloat16
    folder = tmp_path / "bf16"
    torch.manual_seed(0)
    transformers.MistralModel(config).to(torch.bfloat16).save_pretrained(folder)
    loaded = load_model(str(folder), str(folder), device="cpu")
    inputs, _ = batch_of(loaded)
    tokens = extract(loaded, inputs, ["block.0"], progress=False)["block.0"]
    assert tokens.contexts.dtype == torch.float32
    assert (tokens.meta["dtype"], tokens.meta["weights_dtype"]) == ("float32", "bfloat16")
    assert all(p.dtype == torch.float32 for p in loaded.model.net.layers[0].parameters())


def test_bf16_tokens_with_the_default_tolerance_are_refused():
    check_precision("bfloat16", None, 64)  # 64 x 2^-7 = 0.5: usable
    check_precision("bfloat16", 1e-3, 4096)  # an explicit rtol is the user's choice
    with pytest.raises(AuditError, match=r"bfloat16 .* d x eps = 6 >= 1 at d = 768.*--dtype float32") as err:
        check_precision("bf16", None, 768)
    assert "\n" not in str(err.value)
    with pytest.raises(AuditError, match="float16 .* at d = 1024"):
        check_precision("float16", None, 1024)
    with pytest.raises(AuditError, match="unknown dtype"):
        AuditConfig(model="gpt2", dtype="int8")


# --- queries, BOS, Gemma's scaled embedding ------------------------------------------------------------


def test_siglip_query_is_the_patch_mean_or_the_first_patch(tmp_path):
    folder = tmp_path / "siglip"
    save(tiny_config("siglip_vision_model"), folder)
    mean = load_model(str(folder), str(folder), device="cpu")
    first = load_model(str(folder), str(folder), device="cpu", query="first")
    inputs, _ = batch_of(mean)
    a = extract(mean, inputs, ["block.0"], progress=False)["block.0"]
    b = extract(first, inputs, ["block.0"], progress=False)["block.0"]
    assert torch.equal(a.contexts, b.contexts) and mean.n == 16
    assert torch.allclose(a.queries, a.contexts.mean(dim=1)) and a.meta["query_index"] == "mean"
    assert torch.equal(b.queries, b.contexts[:, 0]) and b.meta["query_index"] == "0"
    assert "mean of the n patch tokens" in mean.details["query"]
    with pytest.raises(AuditError, match="--query applies to siglip models only; .* is a decoder model"):
        load_model("qwen2.5-0.5b", "random", device="cpu", query="mean")
    with pytest.raises(AuditError, match="unknown query 'cls'"):
        AuditConfig(model="siglip-base", query="cls")


def test_dinov2_registers_are_in_the_context(tmp_path):
    folder = tmp_path / "reg"
    save(tiny_config("dinov2_with_registers", num_register_tokens=4), folder)
    loaded = load_model(str(folder), str(folder), device="cpu")
    assert (loaded.n, loaded.query_index) == (1 + 4 + 16, 0)
    assert "4 register tokens at rows 1..4, part of the context" in loaded.details["registers"]


@pytest.mark.parametrize(("model_type", "default_bos"), [("llama", True), ("qwen2", False)])
def test_bos_as_the_tokenizer_does_or_as_asked(model_type, default_bos, tmp_path):
    folder = tmp_path / model_type
    config = tiny_config(model_type)
    config.bos_token_id = 1
    save(config, folder)
    rows = {}
    for bos in (None, True, False):
        loaded = load_model(str(folder), str(folder), device="cpu", bos=bos)
        inputs, _ = batch_of(loaded)
        rows[bos] = extract(loaded, inputs, ["embedding"], progress=False)["embedding"].contexts[
            :, 0
        ]  # (N, d)
        assert ("BOS id 1 at position 0" in loaded.details["bos"]) == (default_bos if bos is None else bos)
    same = lambda r: bool((r == r[0]).all())  # noqa: E731 - a BOS row is the same vector in every example
    assert same(rows[True]) and not same(rows[False])
    assert same(rows[None]) == default_bos


def test_gemma_embedding_is_scaled_as_the_model_scales_it(tmp_path):
    folder = tmp_path / "gemma2"
    model = save(tiny_config("gemma2"), folder)
    loaded = load_model(str(folder), str(folder), device="cpu")
    inputs, batch = batch_of(loaded)
    tokens = extract(loaded, inputs, ["embedding"], progress=False)["embedding"].contexts
    ids = batch["input_ids"].clone()
    ids[:, 0] = loaded.model.state["bos_id"]
    table = model.embed_tokens.weight.detach()  # (vocab, d)
    expected = table[ids] * torch.tensor(64**0.5)  # (B, n, d): the rows block 0 receives, scaled by sqrt(d)
    assert torch.allclose(tokens, expected, rtol=0, atol=forward_atol(expected, 1))
    assert not torch.allclose(tokens, table[ids])


# --- through the audit ------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "roberta", "dinov2_with_registers", "siglip_vision_model"])
def test_saved_folder_audits_end_to_end(model_type, tmp_path):
    folder = tmp_path / model_type
    save(tiny_config(model_type), folder, max_shard_size="60KB")
    text = model_type in TEXT_TYPES
    config = AuditConfig(
        model=str(folder),
        weights=(str(folder),),
        samples=24,
        first=True,
        subsets=20,
        layers="0,-1",
        robustness=False,
        threads=1,
        context_length=12 if text else None,
    )
    result = run(
        config, out=None, progress=False
    )  # the rows only: report files and plots are tested elsewhere
    rows = result.rows
    assert set(rows["status"]) == {"ok"} and set(rows["representation"]) == {
        "embedding",
        "block.0",
        "block.2",
    }
    assert set(rows["dtype"]) == {"float32"}
    note = {
        "llama": "; BOS id 1 at position 0",
        "roberta": "",
        "dinov2_with_registers": "; CLS query; 4 registers in",
        "siglip_vision_model": "; query = mean of the n patch tokens",
    }[model_type]
    assert rows["tokenizer"].str.contains(note, regex=False).all()  # the rows say how inputs became tokens
