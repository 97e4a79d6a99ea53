"""``hf:`` data sources: a Hugging Face dataset split (streamed from the hub) or a local folder read by a
``datasets`` builder, shared by the image and the text loaders."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from auditor.core.errors import AuditError, first_line
from auditor.core.network import hub_reachable
from auditor.data.inputs import HF_PREFIX
from auditor.data.selection import visible_files


def _parse_hf(spec: str) -> tuple[str, str | None, str]:
    """``hf:<name>[:<config>]:<split>`` or ``hf:<name>`` -> (name, config, split); split defaults to train."""
    parts = spec[len(HF_PREFIX) :].split(":")
    if not parts[0] or len(parts) > 3:
        raise AuditError(
            f"bad dataset {spec!r}; use hf:<name>, hf:<name>:<split> or hf:<name>:<config>:<split>"
        )
    if len(parts) == 1:
        return parts[0], None, "train"
    if len(parts) == 2:
        return parts[0], None, parts[1]
    return parts[0], parts[1], parts[2]


def load_hf_dataset(
    spec: str, local_builder: str, suffixes: Sequence[str], exclude: str | Path | None = None
) -> tuple[Any, str]:
    """A dataset split (streamed, for the hub) and its label; unreachable or unknown -> AuditError.

    A local folder is read by ``local_builder`` from its files with ``suffixes`` (see
    :func:`~auditor.data.selection.visible_files`: never ``exclude`` nor an audit report) into memory,
    through a temporary cache removed before this returns (nothing is written outside the temporary folder).
    A hub dataset is streamed: read as it is consumed, never cached on disk.
    """
    import datasets

    name, config, split = _parse_hf(spec)
    folder = Path(name).expanduser()
    try:
        if folder.exists():
            files = (
                [str(p) for p in visible_files(folder, suffixes, exclude)] if folder.is_dir() else str(folder)
            )
            if not files:
                raise AuditError(f"no {', '.join(suffixes)} files under {str(folder)!r}")
            # the builder's Arrow cache goes to a temporary folder, removed once the split is in memory:
            # nothing is written to the datasets cache (~/.cache/huggingface/datasets) nor left anywhere
            with tempfile.TemporaryDirectory(prefix="auditor-datasets-") as cache:
                data = datasets.load_dataset(local_builder, data_files={split: files}, split=split,
                                             cache_dir=cache, keep_in_memory=True)
            return data, f"{spec} ({local_builder} builder on local files, split {split})"
        if not hub_reachable():
            raise AuditError(
                f"could not reach the Hugging Face hub for dataset {name!r}; give a local folder or hf:<path>"
            )
        data = datasets.load_dataset(name, config, split=split, streaming=True)
        return data, f"{spec} (Hugging Face hub, streamed)"
    except AuditError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets raises many types (not found, bad split, ...)
        raise AuditError(f"cannot load dataset {spec!r}: {first_line(err)}") from None
