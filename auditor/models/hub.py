"""Where weights come from: the ``weights`` argument (random, pretrained or a local folder), the names of
the weights files a checkpoint folder holds (defined here only), and quiet transformers loading. Whether
the Hugging Face hub answers is asked in :mod:`auditor.core.network` (the data asks it too)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from auditor.core.errors import AuditError, first_line  # noqa: F401  (re-exported)
from auditor.core.network import hub_reachable  # noqa: F401  (re-exported)

WEIGHTS_HELP = "weights must be 'random', 'pretrained' or a folder written by save_pretrained"

# The weights files of a save_pretrained folder (or a hub repository): the only names read, defined here only.
SAFETENSORS = "model.safetensors"  # the whole checkpoint in one file
INDEX_FILE = "model.safetensors.index.json"  # tensor name -> shard, for a checkpoint in several files
SHARDS = "model*.safetensors"  # the single file or the shards (their headers name their tensors)
TORCH_BIN = "pytorch_model.bin"  # a pickle of tensors, read with torch.load(weights_only=True)
TORCH_BINS = "pytorch_model*.bin"  # that pickle, single or sharded
CONVERT_HINT = f"convert it to {SAFETENSORS} (safetensors.torch.save_file or save_pretrained)"


class WeightsUnavailable(AuditError):
    """Pretrained weights cannot be loaded here (offline, not cached, incomplete); the row is skipped."""


def looks_like_path(text: str) -> bool:
    """Whether a name is meant as a local path rather than a hub id ``owner/name`` or a short name."""
    return (
        text in (".", "..")
        or text.startswith(("/", "./", "../", "~", ".\\", "..\\"))
        or "\\" in text
        or text.count("/") > 1
    )


def weights_kind(weights: str) -> str:
    """Classify the ``weights`` argument: ``random``, ``pretrained`` or ``folder``."""
    if weights in ("random", "pretrained"):
        return weights
    path = Path(str(weights)).expanduser()
    if path.is_dir():
        return "folder"
    if path.exists():
        raise AuditError(f"{WEIGHTS_HELP}; {weights!r} is a file, not a folder")
    if looks_like_path(str(weights)):
        raise AuditError(f"weights folder {weights!r} does not exist; {WEIGHTS_HELP}")
    raise AuditError(f"{WEIGHTS_HELP}; {weights!r} is none of these (no such folder)")


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' loading logs and progress bars for one call, then restore them."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def folder_model_type(folder: Path) -> str:
    """``model_type`` of the ``config.json`` in a ``save_pretrained`` folder."""
    import json

    path = folder / "config.json"
    try:
        return str(json.loads(path.read_text()).get("model_type", ""))
    except (OSError, ValueError) as err:
        raise AuditError(
            f"{folder} is not a save_pretrained folder: cannot read config.json ({err})"
        ) from None
