"""Provenance stamped on every result row: git commit, library versions, device, time."""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata
import platform
import subprocess
from pathlib import Path

_PACKAGES = ("attention-auditor", "torch", "transformers", "timm", "datasets", "numpy", "tensorly")


@functools.cache
def git_commit() -> str:
    """Short hash of the checkout this package runs from (``+dirty`` if modified), or ``unknown``."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@functools.cache
def package_versions() -> dict[str, str]:
    """Installed versions of the libraries that shape the numbers (missing ones are left out)."""
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def versions_string() -> str:
    """``name=version`` pairs joined by ``;`` (one CSV cell)."""
    return ";".join(f"{k}={v}" for k, v in package_versions().items())


def timestamp() -> str:
    """UTC time as ``YYYYmmdd-HHMMSS`` (used in default output folder names)."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")


def provenance() -> dict[str, str]:
    """The columns every report row carries."""
    return {"git_commit": git_commit(), "versions": versions_string()}
