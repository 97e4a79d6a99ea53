"""GPT-2 from Hugging Face (``GPT2Model``): ``gpt2``, ``gpt2-large`` and hub ids.

Tokens: n = 1024 by default (the position table; the paper's gpt2-large, d = 1280), settable up to the
position table. A model narrower than 1024 gets the largest power of two <= d / 2 instead (gpt2,
d = 768: n = 256), since n > d leaves no context of rank n. The query is the LAST token (row n - 1), the
only position that sees the whole context under the causal mask. Inputs are contiguous
windows of exactly n tokens of one text stream. ``embedding`` (hidden_states[0]) is token + position
embeddings after the embedding dropout (identity in eval mode).

Tokenizer: GPT-2's BPE when its files can be read (hub or cache). Offline, a byte-level fallback maps
every UTF-8 byte to GPT-2's own id for that single byte: the first 256 entries of GPT-2's vocabulary are
the 256 byte symbols, listed in the order of its byte-to-unicode table (the printable bytes 33-126,
161-172 and 174-255 first, then the remaining ones). The ids are valid GPT-2 ids; only merges are missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer, GPT2Config, GPT2Model

from auditor.data.feed import TextTokenizer
from auditor.models.base import ContextLimits, HFAdapter, ModelSpec, hub_reachable
from auditor.models.registry import register, register_adapter
from auditor.models.tokenizers import gpt2_byte_order, load_tokenizer, wrap_hf_tokenizer

GPT2_DEFAULT_N = 1024  # the paper's gpt2-large setting; narrower models: see ContextLimits.own
GPT2_TOKENIZER_ID = "openai-community/gpt2"  # all GPT-2 sizes share one BPE vocabulary
GPT2_TOKENIZER_FILES = ("tokenizer.json", "vocab.json")
BYTE_FALLBACK_NAME = "gpt2-bytes (offline fallback, no BPE merges)"


_BYTE_TO_ID = np.empty(256, dtype=np.int64)
_BYTE_TO_ID[np.array(gpt2_byte_order())] = np.arange(256)


def byte_fallback_tokenizer() -> TextTokenizer:
    """UTF-8 bytes -> GPT-2 single-byte token ids (offline; one token per byte)."""

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [_BYTE_TO_ID[np.frombuffer(t.encode("utf-8"), dtype=np.uint8)].tolist() for t in texts]

    return TextTokenizer(name=BYTE_FALLBACK_NAME, encode_batch=encode_batch, vocab_size=256)


def gpt2_tokenizer(spec: ModelSpec, kind: str, folder: Path | None, trust_remote_code: bool = False
                   ) -> TextTokenizer:
    """The saved tokenizer of a weights folder (a one-line error when it is there but cannot be read, or is
    custom code without ``trust_remote_code``), else GPT-2's BPE (hub or cache), else the byte fallback."""
    if folder is not None and any((folder / f).is_file() for f in GPT2_TOKENIZER_FILES):
        tok = load_tokenizer(str(folder), local_only=True, trust_remote_code=trust_remote_code)
        return wrap_hf_tokenizer(tok, f"tokenizer saved in {folder.name}/")
    # a weights folder without tokenizer files (e.g. save_pretrained of the model alone) uses GPT-2's BPE
    source = spec.source if kind == "pretrained" and folder is None else GPT2_TOKENIZER_ID
    try:
        tok = AutoTokenizer.from_pretrained(source, local_files_only=not hub_reachable(),
                                            trust_remote_code=False)
    except (OSError, ValueError):
        return byte_fallback_tokenizer()
    wrapped = wrap_hf_tokenizer(tok, f"{source} BPE")
    if not wrapped.encode_batch(["The tower is 324 metres tall."])[0]:  # an empty vocabulary: unusable
        return byte_fallback_tokenizer()
    return wrapped


class GPT2Adapter(HFAdapter):
    family = "gpt2"
    modality = "text"
    text_layout = "stream"
    model_types = ("gpt2",)
    config_class = GPT2Config
    model_class = GPT2Model
    block_paths = ("h",)
    model_kwargs = {}
    optional_weights = ()

    def context_limits(self, config: Any) -> ContextLimits:
        return ContextLimits("GPT-2", positions=int(config.n_positions), preferred=GPT2_DEFAULT_N)

    def query_index(self, n: int) -> int:
        return n - 1

    def make_inputs(self, spec: ModelSpec, kind: str, folder: Path | None, config: Any, *,
                    trust_remote_code: bool = False):
        return gpt2_tokenizer(spec, kind, folder, trust_remote_code), None

    def forward(self, model, batch) -> None:
        model(input_ids=batch["input_ids"], use_cache=False)


GPT2 = register_adapter(GPT2Adapter())


def _gpt2_large() -> GPT2Config:
    return GPT2Config(n_embd=1280, n_layer=36, n_head=20, n_positions=1024)


# GPT2Config() defaults are GPT-2 small: 768 wide, 12 blocks, 12 heads, 1024 positions, vocabulary 50257.
register(ModelSpec("gpt2", GPT2, "openai-community/gpt2", GPT2Config, "GPT-2 small (124M); n = 256"))
register(
    ModelSpec(
        "gpt2-large", GPT2, "openai-community/gpt2-large", _gpt2_large, "GPT-2 large; paper A at n = 1024"
    )
)
