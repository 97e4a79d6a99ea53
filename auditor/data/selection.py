"""Which examples of a source an audit reads, and which files it never reads.

A source with more examples than asked for gives a seeded uniform random subset (the audit's seed), kept
in source order; ``first=True`` takes the first ones instead. The label of the inputs says which. Files
are never read from the report folder being written (``exclude``), from an earlier audit report (a
folder holding ``results.csv`` and ``summary.md``, or an interrupted run's ``results.partial.json``),
or from hidden folders (``.git``, ``.venv``, ...) and ``__pycache__``, as the datasets library's folder
builders also skip them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from auditor.core.errors import AuditError

REPORT_MARKERS = (("results.csv", "summary.md"), ("results.partial.json",))


def random_order(total: int, seed: int) -> list[int]:
    """A seeded permutation of ``range(total)``: the same (total, seed) gives the same order everywhere."""
    try:
        gen = torch.Generator().manual_seed(seed)
    except (RuntimeError, OverflowError, TypeError):
        raise AuditError(f"seed must be an integer in [-2**63, 2**64); got {seed!r}") from None
    keys = torch.rand(total, generator=gen, dtype=torch.float64)  # (total,)
    return keys.argsort(stable=True).tolist()


def reading_order(total: int, samples: int, seed: int, first: bool) -> list[int]:
    """Indices of a source's examples in the order they are tried: source order when ``first`` or when
    every example is wanted, else a seeded random order (the caller keeps the first ``samples`` usable
    ones and sorts them back into source order)."""
    return list(range(total)) if first or total <= samples else random_order(total, seed)


def selection_note(kept: int, total: int, what: str, *, samples: int, seed: int, first: bool) -> str:
    """How ``kept`` examples were chosen from a source of ``total`` when ``samples`` were asked for:
    ``"all 486 crops"``, ``"first 300 of 1000 image files"`` or
    ``"300 of 1000 image files drawn at random (seed 0)"``."""
    if total <= samples:
        return f"all {total} {what}"
    if first:
        return f"first {kept} of {total} {what}"
    return f"{kept} of {total} {what} drawn at random (seed {seed})"


def is_report_folder(folder: Path) -> bool:
    """Whether ``folder`` is (or was being written as) an audit report."""
    return any(all((folder / name).is_file() for name in names) for names in REPORT_MARKERS)


def left_out_note(folder: Path, suffixes: Iterable[str], exclude: str | Path | None = None) -> str:
    """For an error when :func:`visible_files` found nothing: why the files with ``suffixes`` under ``folder``
    (if any) were left out ("" when there are none)."""
    wanted = {s.lower() for s in suffixes}
    found = [p for p in folder.rglob("*") if p.suffix.lower() in wanted and p.is_file()]
    if not found:
        return ""
    out = Path(exclude).expanduser().resolve() if exclude is not None else None
    inside = sum(1 for p in found if out is not None and out in p.resolve().parents)
    reasons = ([f"{inside} inside the output folder --out {str(exclude)!r}"] if inside else []) + (
        [f"{len(found) - inside} in hidden folders or audit report folders"] if len(found) > inside else [])
    return (
        f" ({len(found)} found, none read as data: {', '.join(reasons)}; put the data in a folder of its own)"
    )


def visible_files(folder: Path, suffixes: Iterable[str], exclude: str | Path | None = None) -> list[Path]:
    """Files under ``folder`` with one of ``suffixes`` (case-insensitive), sorted by relative path, leaving
    out ``exclude``, audit reports, hidden folders/files and ``__pycache__``."""
    wanted = {s.lower() for s in suffixes}
    skip = {Path(exclude).expanduser().resolve()} if exclude is not None else set()
    reports: dict[Path, bool] = {}  # folder -> is an audit report (each folder checked once)
    files: list[Path] = []
    for path in folder.rglob("*"):
        relative = path.relative_to(folder)
        if any(p.startswith((".", "__")) for p in relative.parts) or path.suffix.lower() not in wanted:
            continue
        if not path.is_file() or skip & set(path.resolve().parents):
            continue
        inside = [folder / parent for parent in relative.parents]  # folders from path's up to `folder`
        for f in inside:
            if f not in reports:
                reports[f] = is_report_folder(f)
        if any(reports[f] for f in inside):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())
