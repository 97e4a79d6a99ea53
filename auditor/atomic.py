"""Files written atomically: a reader (or a resumed run) never sees a half-written file.

Each write goes to a temporary file in the target's folder, is flushed and fsync'ed, then renamed over
the target with ``os.replace``. Temporary files are named ``.<name>.<random><TMP_SUFFIX>`` so a run that
was killed mid-write can find and remove its leftovers. Files get the mode a plain ``open`` would give
under the current umask (``mkstemp`` alone would make them private).

A link already at the target is replaced by the new file; its target is never written. :class:`Staged`
writes several files side by side first and renames them into place only once all were written, so a
full disk or a failed plot leaves the previous files (or none) instead of half a report.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

TMP_SUFFIX = ".tmp"


def new_file_mode() -> int:
    """Mode of a newly created regular file under the current umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def temporary_path(path: Path) -> Path:
    """A new empty temporary file next to ``path`` (same file system, so the final rename is atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    os.fchmod(fd, new_file_mode())
    os.close(fd)
    return Path(tmp)


def _write_synced(tmp: Path, text: str) -> None:
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        _write_synced(tmp, text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_csv_atomic(frame: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``frame`` to ``path`` as CSV (no index) atomically."""
    write_text_atomic(path, frame.to_csv(index=False))


class Staged:
    """Files written as temporaries next to their targets, then renamed into place together.

    >>> with Staged() as staged:
    ...     staged.text(out / "summary.md", text)
    ...     staged.write(out / "plot.png", lambda tmp: fig.savefig(tmp, format="png"))
    ...     staged.commit()

    Leaving the block without :meth:`commit` (an exception) removes the temporaries; the targets keep
    what they held before.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path]] = []  # (temporary, target)

    def write(self, path: str | os.PathLike[str], writer: Callable[[Path], object]) -> Path:
        """Call ``writer(temporary path)`` to fill the file that will become ``path``."""
        path = Path(path)
        tmp = temporary_path(path)
        self._pending.append((tmp, path))
        writer(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        return path

    def text(self, path: str | os.PathLike[str], text: str) -> Path:
        """Stage ``text`` as the new content of ``path``."""
        return self.write(path, lambda tmp: _write_synced(tmp, text))

    def commit(self) -> list[Path]:
        """Rename every staged file over its target (replacing a link, never writing through it)."""
        done = []
        while self._pending:
            tmp, path = self._pending[0]
            os.replace(tmp, path)
            self._pending.pop(0)
            done.append(path)
        return done

    def discard(self) -> None:
        """Remove the temporaries not committed yet."""
        for tmp, _ in self._pending:
            tmp.unlink(missing_ok=True)
        self._pending.clear()

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()
