"""Decoder-only LLMs: Llama 2/3, Qwen2/2.5, Qwen3, Mistral, Gemma 1/2/3 (text), Phi-3, OLMo 1/2 and
GPT-NeoX/Pythia, one adapter for all of them (their layouts are the same: an embedding, a list of blocks,
a final norm).

Tokens: n contiguous tokens of one text stream, as for GPT-2; the query is the LAST token (row n - 1),
the only one that sees the whole context under the causal mask. ``embedding`` is what block 0 receives,
read by a hook on its input, so a family's own embedding path is kept as it is: Gemma's scaling by
sqrt(d) is in it; rotary families (all of these) add positions inside attention, so their ``embedding``
carries no position (a token repeated in a window gives two equal rows).

BOS: position 0 holds the BOS token when the model's tokenizer adds one (Llama, Mistral, Gemma), and a
text token otherwise (Qwen, Phi-3, OLMo, Pythia); ``bos=True/False`` (``--bos/--no-bos``) forces either.
The BOS replaces the first token of each window, so n stays the context length. Attention runs as
the model's own code runs it (sliding windows, Gemma 2's soft-capping with eager attention); the
report's details say, per model, the rotary base and whether a sliding window is shorter than n.

Context length: the family's own n is 128 tokens (within the position table and d). The adapter reports
the weights of one block (:func:`block_parameters`, GQA and gated MLPs counted), and the audit's one cost
rule (``auditor.audit.plan.default_context_length``) halves n while a default audit would take more than
minutes on two CPU cores (qwen2.5-0.5b and llama-3.2-1b: 128; gemma-2-2b and phi-3-mini: 64; mistral-7b
and llama-3.1-8b: 32). Give ``--context-length`` (up to the position table and d) for longer contexts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import transformers
from torch import nn

from auditor.models.base import ContextLimits, ModelSpec
from auditor.models.partial_adapter import PartialAdapter
from auditor.models.registry import register, register_adapter
from auditor.models.tokenizers import byte_tokenizer, saved_tokenizer

DECODER_DEFAULT_N = 128  # the family's own n; the audit's cost rule may halve it
# Whether the family's tokenizer puts a BOS token first (used when no tokenizer comes with the weights).
ADDS_BOS = {"llama": True, "mistral": True, "gemma": True, "gemma2": True, "gemma3_text": True,
            "qwen2": False, "qwen3": False, "phi3": False, "olmo": False, "olmo2": False, "gpt_neox": False}
EAGER = ("gemma2", "gemma3_text")  # logit soft-capping: the eager attention is the reference implementation


def special_ids(config: Any) -> list[int]:
    """The special-token ids a config names (BOS, EOS, padding), flattened."""
    out: list[int] = []
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "cls_token_id", "sep_token_id"):
        value = getattr(config, key, None)
        out.extend(value if isinstance(value, list) else [] if value is None else [value])
    return [int(v) for v in out]


def block_parameters(config: Any) -> int:
    """Weights of one decoder block (attention and MLP; norms are negligible), from the config alone."""
    d, heads = int(config.hidden_size), int(config.num_attention_heads)
    head = int(getattr(config, "head_dim", None) or d // heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    ff = int(config.intermediate_size)
    gated = config.model_type != "gpt_neox"  # SwiGLU/GeGLU: gate, up and down projections
    return 2 * d * heads * head + 2 * d * kv * head + (3 if gated else 2) * d * ff


def byte_offset(config: Any) -> int:
    """First id above the special tokens that sit among the first 300 ids (0 when none do)."""
    low = [v for v in special_ids(config) if v < 300]
    return max(low) + 1 if low else 0


class DecoderAdapter(PartialAdapter):
    family = "decoder"
    modality = "text"
    text_layout = "stream"
    model_types = tuple(ADDS_BOS)
    block_path = "layers"
    after_blocks = ("norm.", "final_layer_norm.")
    options = ("bos",)
    config_class = transformers.AutoConfig

    def context_limits(self, config: Any) -> ContextLimits:
        config = self.tower(config)
        return ContextLimits(config.model_type, positions=int(config.max_position_embeddings),
                             preferred=DECODER_DEFAULT_N, block_weights=block_parameters(config))

    def query_index(self, n: int) -> int:
        return n - 1

    def _instantiate(self, config: Any) -> nn.Module:
        if config.model_type in EAGER:
            config._attn_implementation = "eager"
        return super()._instantiate(config)

    def make_loaded_inputs(
        self, spec: ModelSpec, kind: str, source: str | None, config: Any, options: Mapping[str, Any]
    ):
        found = (
            saved_tokenizer(source, folder=kind == "folder", label=f"tokenizer of {source}",
                            trust_remote_code=bool(options.get("trust_remote_code")))
            if source
            else None
        )
        if found is not None:
            tokenizer, raw = found
            adds = raw.bos_token_id is not None and raw("a", add_special_tokens=True)["input_ids"][:1] == [
                raw.bos_token_id
            ]
            bos_id = raw.bos_token_id
        else:
            tokenizer = byte_tokenizer(byte_offset(config))
            adds = ADDS_BOS[config.model_type]
            bos_id = config.bos_token_id
        want = options.get("bos")
        use = adds if want is None else bool(want)
        if use and bos_id is None:
            from auditor.core.errors import AuditError

            raise AuditError(f"{spec.name} has no BOS token (bos_token_id is unset); audit it without --bos")
        state = {
            "bos_id": int(bos_id) if use else None,
            "why": "as its tokenizer does" if want is None else "as asked",
        }
        bos_note = f"BOS id {bos_id} at position 0" if use else "no BOS"
        return (
            dataclasses.replace(tokenizer, name=f"{tokenizer.name}; {bos_note}"),
            None,
            state,
        )  # rows say it

    def notes(self, config: Any, n: int, state: Mapping[str, Any]) -> dict[str, str]:
        bos_id, why = state["bos_id"], state["why"]
        out = {"bos": f"BOS id {bos_id} at position 0 ({why})" if bos_id is not None
               else f"no BOS: position 0 is a text token ({why})"}
        theta = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get(
            "rope_theta"
        )
        out["positions"] = f"rotary in attention (base {theta}); the embedding carries no position"
        window = getattr(config, "sliding_window", None)
        types = getattr(config, "layer_types", None) or []
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        if window and (sliding or not types) and getattr(config, "use_sliding_window", True):
            where = f"blocks {sliding[0]}, {sliding[1]}, ..." if len(sliding) > 1 else "every block"
            effect = "no effect at this n" if int(window) >= n else f"shorter than n = {n}: it masks"
            out["attention"] = f"causal; sliding window {window} in {where} ({effect})"
        else:
            out["attention"] = "causal, full context"
        return out

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
        ids = batch["input_ids"]
        bos = model.state["bos_id"]
        if bos is not None:
            ids = ids.clone()
            ids[:, 0] = bos  # (B, n): BOS first, then n - 1 tokens of the window
        model.net(input_ids=ids, use_cache=False)


DECODER = register_adapter(DecoderAdapter())


def _decoder_config(cls: type[transformers.PretrainedConfig], *, vocab: int, d: int, ffn: int, blocks: int,
                    heads: int, kv_heads: int, positions: int, norm_eps: float,
                    rope_theta: float | None = None, **family: Any) -> Any:
    """A decoder config of class ``cls`` from the fields every family sets, ``rope_theta`` as default
    rotary parameters (None: none given), and the family's own fields."""
    if rope_theta is not None:
        family["rope_parameters"] = {"rope_type": "default", "rope_theta": rope_theta}
    return cls(vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=blocks,
               num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions,
               rms_norm_eps=norm_eps, **family)


def _llama3(hidden: int, inter: int, layers: int, factor: float, tie: bool) -> transformers.LlamaConfig:
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    return _decoder_config(transformers.LlamaConfig, vocab=128256, d=hidden, ffn=inter, blocks=layers,
                           heads=32, kv_heads=8, positions=131072, norm_eps=1e-5, head_dim=hidden // 32,
                           tie_word_embeddings=tie, bos_token_id=128000, eos_token_id=128001,
                           rope_parameters=rope)


def llama_3_2_1b() -> transformers.LlamaConfig:
    return _llama3(2048, 8192, 16, 32.0, True)


def llama_3_1_8b() -> transformers.LlamaConfig:
    return _llama3(4096, 14336, 32, 8.0, False)


def qwen2_5_0_5b() -> transformers.Qwen2Config:
    return _decoder_config(transformers.Qwen2Config, vocab=151936, d=896, ffn=4864, blocks=24, heads=14,
                           kv_heads=2, positions=32768, norm_eps=1e-6, rope_theta=1000000.0,
                           tie_word_embeddings=True, use_sliding_window=False, bos_token_id=151643,
                           eos_token_id=151643)


def qwen3_0_6b() -> transformers.Qwen3Config:
    return _decoder_config(transformers.Qwen3Config, vocab=151936, d=1024, ffn=3072, blocks=28, heads=16,
                           kv_heads=8, positions=40960, norm_eps=1e-6, rope_theta=1000000.0, head_dim=128,
                           tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643)


def mistral_7b() -> transformers.MistralConfig:
    return _decoder_config(transformers.MistralConfig, vocab=32000, d=4096, ffn=14336, blocks=32, heads=32,
                           kv_heads=8, positions=32768, norm_eps=1e-5, rope_theta=10000.0,
                           sliding_window=4096, bos_token_id=1, eos_token_id=2)


def gemma_2_2b() -> transformers.Gemma2Config:
    return _decoder_config(transformers.Gemma2Config, vocab=256000, d=2304, ffn=9216, blocks=26, heads=8,
                           kv_heads=4, positions=8192, norm_eps=1e-6, head_dim=256, query_pre_attn_scalar=256,
                           sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                           hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1,
                           bos_token_id=2)


def phi_3_mini() -> transformers.Phi3Config:
    return _decoder_config(transformers.Phi3Config, vocab=32064, d=3072, ffn=8192, blocks=32, heads=32,
                           kv_heads=32, positions=4096, norm_eps=1e-5, rope_theta=10000.0,
                           original_max_position_embeddings=4096, sliding_window=2047, bos_token_id=1,
                           eos_token_id=32000, pad_token_id=32000)


for _name, _hub, _config, _what in (
    ("llama-3.2-1b", "meta-llama/Llama-3.2-1B", llama_3_2_1b, "Llama 3.2 1B (d 2048, 16 blocks)"),
    ("llama-3.1-8b", "meta-llama/Llama-3.1-8B", llama_3_1_8b, "Llama 3.1 8B (d 4096, 32 blocks)"),
    ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", qwen2_5_0_5b, "Qwen2.5 0.5B (d 896, 24 blocks)"),
    ("qwen3-0.6b", "Qwen/Qwen3-0.6B-Base", qwen3_0_6b, "Qwen3 0.6B (d 1024, 28 blocks)"),
    ("mistral-7b", "mistralai/Mistral-7B-v0.1", mistral_7b, "Mistral 7B v0.1 (d 4096, 32 blocks)"),
    ("gemma-2-2b", "google/gemma-2-2b", gemma_2_2b, "Gemma 2 2B (d 2304, 26 blocks)"),
    ("phi-3-mini", "microsoft/Phi-3-mini-4k-instruct", phi_3_mini, "Phi-3 mini 4k (d 3072, 32 blocks)"),
):
    register(ModelSpec(_name, DECODER, _hub, _config, _what))  # `audit models` prints the n of its audit
