"""Text encoders after BERT: RoBERTa, DeBERTa-v3 (``deberta-v2``) and ModernBERT, one adapter.

As for BERT: the query is the first token (``<s>`` / ``[CLS]``, row 0) and the inputs are sentence
pairs ``<s> s1 </s> s2 </s>`` (``[CLS] s1 [SEP] s2 [SEP]``) of exactly n tokens; n = 512 by default
within the position table and the width. None of these takes token types (RoBERTa has one type,
DeBERTa-v3 none, ModernBERT none), so only the ids are passed. ``embedding`` is what block 0 receives:
token + learned positions after the LayerNorm (RoBERTa), tokens after the LayerNorm with relative
positions inside attention (DeBERTa-v3), tokens after the norm with rotary positions in attention
(ModernBERT, which alternates global attention and a local window; the details say where).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import transformers
from torch import nn

from auditor.models.base import ContextLimits, ModelSpec
from auditor.models.decoder import byte_offset
from auditor.models.partial_adapter import PartialAdapter
from auditor.models.registry import register_adapter
from auditor.models.tokenizers import byte_tokenizer, saved_tokenizer

ENCODER_DEFAULT_N = 512  # BERT's paper setting
POSITION_OFFSET = {"roberta": 2}  # RoBERTa's positions start after the padding id: 514 entries hold 512
CLS_SEP = {"roberta": (0, 2), "deberta-v2": (1, 2)}  # <s> </s>; [CLS] [SEP] of the DeBERTa-v3 vocabulary


class EncoderAdapter(PartialAdapter):
    family = "encoder"
    modality = "text"
    text_layout = "pairs"
    model_types = ("roberta", "deberta-v2", "modernbert")
    block_path = "layers"
    after_blocks = ("final_norm.", "pooler.")
    config_class = transformers.AutoConfig
    model_kwargs: Mapping[str, Any] = {}

    def block_path_of(self, config: Any) -> str:
        return "encoder.layer" if config.model_type in ("roberta", "deberta-v2") else "layers"

    def _instantiate(self, config: Any) -> nn.Module:
        if config.model_type == "roberta":
            from auditor.models.hub import quiet_transformers

            with quiet_transformers():
                return transformers.RobertaModel(config, add_pooling_layer=False)
        return super()._instantiate(config)

    def context_limits(self, config: Any) -> ContextLimits:
        positions = int(config.max_position_embeddings) - POSITION_OFFSET.get(config.model_type, 0)
        return ContextLimits(config.model_type, positions=positions, preferred=ENCODER_DEFAULT_N, minimum=5,
                             layout="<s> s1 </s> s2 </s>")

    def make_loaded_inputs(self, spec: ModelSpec, kind: str, source: str | None, config: Any,
                           options: Mapping[str, Any]):
        found = (
            saved_tokenizer(source, folder=kind == "folder", label=f"tokenizer of {source}",
                            trust_remote_code=bool(options.get("trust_remote_code")))
            if source
            else None
        )
        if found is not None:
            return found[0], None, {}
        cls_id, sep_id = CLS_SEP.get(config.model_type) or (config.cls_token_id, config.sep_token_id)
        return byte_tokenizer(max(byte_offset(config), 4), cls_id=cls_id, sep_id=sep_id), None, {}

    def notes(self, config: Any, n: int, state: Mapping[str, Any]) -> dict[str, str]:
        kind = config.model_type
        if kind == "roberta":
            return {
                "positions": "learned absolute positions in the embedding",
                "attention": "bidirectional, full",
            }
        if kind == "deberta-v2":
            return {"positions": "relative positions inside attention (disentangled); none in the embedding",
                    "attention": "bidirectional, full"}
        window = int(config.local_attention)
        local = [
            i
            for i, kind in enumerate(getattr(config, "layer_types", None) or [])
            if kind == "sliding_attention"
        ]
        effect = "no effect at this n" if window >= n else f"shorter than n = {n}: it masks"
        where = (
            f"blocks {', '.join(map(str, local[:4]))}{', ...' if len(local) > 4 else ''}"
            if local
            else "no block"
        )
        return {
            "positions": "rotary in attention; the embedding carries no position",
            "attention": f"bidirectional; a local window of {window} in {where} ({effect}), global elsewhere",
        }

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
        model.net(input_ids=batch["input_ids"])


ENCODER = register_adapter(EncoderAdapter())
