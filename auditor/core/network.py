"""Whether the Hugging Face hub can be reached, asked once per process: without this check every hub
look-up on an offline machine costs about 40 s of retries before it fails (models and data both ask)."""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (checked once per process); ``HF_HUB_OFFLINE=1``
    forces offline."""
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
