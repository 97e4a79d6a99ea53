"""The report folder of an audit (``--out``): created, locked, resumed from and tidied.

- :class:`ReportFolder` creates the folder (and remembers which folders it made), holds an exclusive
  lock on ``.lock`` inside it for the whole run (a second audit into the same folder is refused), and
  at the end removes the files this tool writes that the run did not produce (a previous run's
  ``sweep.csv``, plots, tokens, partial rows). A failed run removes the lock and the folders it made,
  when they are empty. Nothing is ever written through a link: files are replaced (see
  :mod:`auditor.core.atomic`) and a ``tokens`` link is replaced by a real folder.
- :class:`RowStore` keeps the rows of a run as they finish in ``results.partial.csv`` and offers the rows
  of an earlier run of the same configuration (interrupted: ``results.partial.csv``; finished:
  ``results.csv``) for reuse, each tagged with the fingerprint of the data it was computed on.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from auditor.audit.report.catalogue import KRUSKAL_TESTS
from auditor.audit.report.schema import csv_text, read_rows, rows_frame
from auditor.core.atomic import TMP_SUFFIX, confined, foreign_entries, refuse_foreign, write_text_atomic
from auditor.core.errors import AuditError

log = logging.getLogger(__name__)

PARTIAL_CSV = "results.partial.csv"  # rows of a run in progress (or interrupted); removed at the end
PARTIAL_CONFIG = "results.partial.json"  # the configuration those rows belong to (resume only if equal)
LOCK = ".lock"
TOKENS = "tokens"
OWNED_FILES = (
    "results.csv",
    "sweep.csv",
    "depth.csv",
    "config.json",
    "summary.md",
    "report.html",
    "kruskal_curve.png",
    "context_ranks.png",
    "margins.png",
    "rtol_sweep.png",
    "depth_kruskal.png",
    "depth_geometry.png",
    "depth_fractions.png",
    PARTIAL_CSV,
    PARTIAL_CONFIG,
)
# ... and the PDF written beside each figure
OWNED_NAMES = OWNED_FILES + tuple(n.removesuffix(".png") + ".pdf" for n in OWNED_FILES if n.endswith(".png"))


def _owned_name(name: str) -> bool:
    """A name the audit writes (or removes) in its report folder."""
    return name in OWNED_NAMES or name == TOKENS


def _is_audit_report(path: Path) -> bool:
    """Whether ``path`` holds the rows (finished or partial) or the configuration an audit wrote."""
    for rows in ("results.csv", PARTIAL_CSV):
        try:
            with open(path / rows, newline="") as fh:
                header = set(fh.readline().strip().split(","))
        except (OSError, UnicodeDecodeError):
            continue
        if {"model", "representation", "test", "status"} <= header:
            return True
    for config in ("config.json", PARTIAL_CONFIG):
        try:
            stored = json.loads((path / config).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(stored, dict) and {"model", "tests", "representations"} <= set(stored):
            return True
    return False


def check_report_folder(path: Path) -> None:
    """Refuse an existing ``--out`` that is not an audit's report folder and holds visible files: the audit
    would write among them (``--out .`` in a project) or replace some (a ``config.json`` or ``summary.md`` of
    the user's; ``tidy`` would remove a ``sweep.csv``). A report folder (its rows or its configuration are an
    audit's) is accepted with whatever else the user keeps in it: only the audit's own files are written or
    removed. Links with the audit's names and its ``tokens`` folder are accepted anywhere: they are replaced,
    never followed, so nothing of the user's is touched."""
    if _is_audit_report(path):
        return
    foreign = foreign_entries(path, lambda n: (_owned_name(n) and (path / n).is_symlink()) or n == TOKENS)
    clashing = [n for n in foreign if _owned_name(n)]  # the audit's names, as the user's own files
    others = [n for n in foreign if not _owned_name(n)]
    refuse_foreign(path, others, "an audit", ", or the folder of an earlier audit to resume or redo it")
    if clashing:
        raise AuditError(
            f"--out {str(path)!r} holds {', '.join(clashing)} but no audit's results (results.csv "
            f"or {PARTIAL_CSV} with an audit's columns); an audit would replace them: give a new or "
            "empty folder"
        )


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet (deepest first)."""
    missing = []
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        missing.append(p)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """rmdir each folder (deepest first) while it is empty; never deletes a file."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


class ReportFolder:
    """An output folder held by one audit run; use as a context manager (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.created: list[Path] = []  # folders this run made, deepest first
        self.produced: set[Path] = set()  # files this run wrote (the report, tokens)
        self._fd: int | None = None
        self._confined: contextlib.AbstractContextManager[None] | None = None

    def __enter__(self) -> ReportFolder:
        check_report_folder(self.path)
        self.created = _missing_folders(self.path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise AuditError(f"cannot write to output folder {str(self.path)!r} ({err.strerror}); "
                             "choose another --out") from None
        try:
            self._lock()
        except BaseException:
            _remove_empty(self.created)
            raise
        self._confined = confined(self.path)
        self._confined.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self._confined is not None:
            self._confined.__exit__(None, None, None)
            self._confined = None
        self._unlock()
        if kind is not None:  # failed or interrupted: leave no folder this run made and left empty
            _remove_empty(self.created)

    # -- the lock --------------------------------------------------------------------------------
    def _lock(self) -> None:
        """Take ``.lock`` (created if needed, never through a link); refuse when another run holds it."""
        try:
            import fcntl
        except ImportError:  # not POSIX: no locking
            return
        path = self.path / LOCK
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        while True:
            try:
                fd = os.open(path, flags, 0o644)
            except OSError as err:
                if err.errno == errno.ELOOP:  # a link where the lock belongs: replaced, never followed
                    path.unlink()
                    continue
                if err.errno == errno.EISDIR:
                    raise AuditError(
                        f"{str(path)!r} is a folder where the audit keeps its lock file; remove it or "
                        "choose another --out"
                    ) from None
                raise AuditError(f"cannot create the lock file {str(path)!r} ({err.strerror}); "
                                 "choose another --out") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise AuditError(
                    f"another audit is writing into {str(self.path)!r} (it holds {LOCK}); wait for "
                    "it to finish or choose another --out"
                ) from None
            except OSError:  # a file system without flock: proceed unlocked
                log.warning("cannot lock %s; make sure no other audit writes into %s", path, self.path)
            try:  # the previous holder removes the file when it is done: hold the file that is there now
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return
            os.close(fd)

    def _unlock(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                (self.path / LOCK).unlink()  # while still held, so no other run holds a removed file
            os.close(self._fd)
            self._fd = None

    # -- files -----------------------------------------------------------------------------------
    def tokens_dir(self) -> Path:
        """``tokens/`` inside the folder, a real folder (a link there is replaced, never followed)."""
        folder = self.path / TOKENS
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            folder.unlink()
        if not folder.exists():
            folder.mkdir()
            self.created.insert(0, folder)
        return folder

    def tidy(self, keep: set[Path] = frozenset()) -> list[Path]:
        """Remove the files this tool writes that this run did not produce, and leftover temporaries.

        ``keep``: files never removed (e.g. token files given as input). Returns the removed paths.
        """
        kept = {p.absolute() for p in (*keep, *self.produced)}
        inputs = {p.resolve() for p in keep}
        candidates = [self.path / name for name in OWNED_NAMES]
        candidates += [p for p in self.path.glob(f".*{TMP_SUFFIX}") if _is_owned_temporary(p.name)]
        tokens = self.path / TOKENS
        if tokens.is_dir() and not tokens.is_symlink():
            candidates += [*tokens.glob("*@*.safetensors"), *tokens.glob(f".*{TMP_SUFFIX}")]
        removed = []
        for path in candidates:
            if not (path.is_symlink() or path.exists()) or path.absolute() in kept:
                continue
            if not path.is_symlink() and path.resolve() in inputs:
                continue
            path.unlink()  # a link is removed, its target left alone
            removed.append(path)
        if tokens.is_dir() and not tokens.is_symlink():
            _remove_empty([tokens])
        return removed


def _is_owned_temporary(name: str) -> bool:
    """A temporary file left by an interrupted atomic write of one of this tool's files."""
    return any(name.startswith(f".{owned}.") for owned in OWNED_NAMES)


# ---------------------------------------------------------------------------------------------------
# Rows as they finish, and the rows of an earlier run that may be reused
# ---------------------------------------------------------------------------------------------------

_REUSED = re.compile(r"(?:^|; )reused from [^;]*")


@dataclass
class Previous:
    """A finished row of an earlier run and where it was read from."""

    row: dict[str, Any]
    origin: str  # "the interrupted run's results.partial.csv" | "the finished run's results.csv"


@dataclass
class RowStore:
    """Rows and curves as they finish; rows reach ``out/results.partial.csv`` at once, so an interrupted
    run keeps them (only once a test has run: skip rows alone are not worth a file).

    ``previous``: finished Kruskal rows of an earlier run with the same configuration, computed by the
    same code and library versions (``stamp``: git commit and versions), by (representation, weights,
    test); :meth:`reuse` hands one out only when it was computed on data with the same fingerprint.
    Rows not consumed yet stay in the partial file, so a second interruption does
    not lose them.
    """

    out: Path | None
    stamp: dict[str, Any]
    config: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    curves: list[pd.DataFrame] = field(default_factory=list)
    previous: dict[tuple[str, str, str], Previous] = field(default_factory=dict)

    def load_previous(self) -> int:
        """Read the reusable rows of an earlier run of this configuration in ``out``; return how many."""
        if self.out is None:
            return 0
        sources = (("results.csv", "config.json", "the finished run's results.csv"),
                   (PARTIAL_CSV, PARTIAL_CONFIG, "the interrupted run's results.partial.csv"))
        for rows_name, config_name, origin in sources:  # partial rows are newer: they win
            frame = self._read_if_same(self.out / rows_name, self.out / config_name)
            if frame is None:
                continue
            for row in frame[(frame["status"] == "ok") & frame["test"].isin(KRUSKAL_TESTS)].to_dict(
                "records"
            ):
                row = {k: v for k, v in row.items() if not _empty(v)}
                if any(str(row.get(key, "")) != str(value) for key, value in self.stamp.items()):
                    continue  # computed by other code or library versions: tested again
                if row.get("data_fingerprint"):
                    self.previous[(row["representation"], row["weights"], row["test"])] = Previous(
                        row, origin
                    )
        return len(self.previous)

    def _read_if_same(self, rows: Path, config: Path) -> pd.DataFrame | None:
        if not (rows.is_file() and config.is_file()):
            return None
        try:
            stored = json.loads(config.read_text())
            if not isinstance(stored, dict) or any(
                stored.get(k, _ABSENT) != v for k, v in self.config.items()
            ):
                return None
            frame = read_rows(rows)
        except (OSError, ValueError, KeyError, TypeError):  # unreadable or from another version: start afresh
            return None
        return frame if {"representation", "weights", "test", "status"} <= set(frame.columns) else None

    def reuse(self, representation: str, weights: str, test: str, fingerprint: str) -> dict[str, Any] | None:
        """The earlier row of this test if it was computed on the same data, with a note saying so."""
        found = self.previous.get((representation, weights, test))
        if found is None or found.row.get("data_fingerprint") != fingerprint:
            return None
        del self.previous[(representation, weights, test)]
        row = dict(found.row)
        note = _REUSED.sub("", str(row.get("note", ""))).strip("; ")
        row["note"] = f"{note}; reused from {found.origin}" if note else f"reused from {found.origin}"
        return row

    def settle(self, representation: str, weights: str) -> None:
        """Forget the earlier rows of a representation once it has been tested again (stale now)."""
        for key in [k for k in self.previous if k[:2] == (representation, weights)]:
            del self.previous[key]

    def add(self, *rows: dict[str, Any]) -> None:
        self.records += rows
        self.save()

    def save(self) -> None:
        """Write this run's rows (and the earlier ones still reusable) to the partial file."""
        if self.out is None or not any(r.get("status") == "ok" for r in self.records):
            return
        rows = self.records + [p.row for p in self.previous.values()]
        try:
            write_text_atomic(self.out / PARTIAL_CONFIG, json.dumps(self.config, indent=1))
            write_text_atomic(self.out / PARTIAL_CSV, csv_text(rows_frame(rows, self.stamp)))
        except OSError as err:
            raise AuditError(f"cannot save finished rows in {str(self.out)!r} ({err.strerror or err}); "
                             "free some space or choose another --out") from None


_ABSENT = object()


def _empty(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
