"""Files written atomically: a reader (or a resumed run) never sees a half-written file.

Each write goes to a temporary file in the target's folder, is flushed and fsync'ed, then renamed over
the target with ``os.replace``. Temporary files are named ``.<name>.<random><TMP_SUFFIX>`` so a run that
was killed mid-write can find and remove its leftovers. Files get the mode a plain ``open`` would give
under the current umask (``mkstemp`` alone would make them private).
"""

from __future__ import annotations

import os
import tempfile
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


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_csv_atomic(frame: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``frame`` to ``path`` as CSV (no index) atomically."""
    write_text_atomic(path, frame.to_csv(index=False))
