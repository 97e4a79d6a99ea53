"""Where weights come from: the ``weights`` argument (random, pretrained or a local folder), whether the
Hugging Face hub answers, and quiet transformers loading."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from auditor.core.errors import AuditError

WEIGHTS_HELP = "weights must be 'random', 'pretrained' or a folder written by save_pretrained"


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


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (checked once per process).

    Without this check every hub look-up in an offline machine costs ~40 s of retries before failing.
    ``HF_HUB_OFFLINE=1`` forces offline.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    try:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    except (ImportError, AttributeError):
        endpoint = "https://huggingface.co"
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception message (errors are reported as one line)."""
    for line in str(err).splitlines():
        if line.strip():
            return line.strip()
    return type(err).__name__


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
