"""Files written atomically: a reader (or a resumed run) never sees a half-written file.

Each write goes to a temporary file in the target's folder, is flushed and fsync'ed, then renamed over
the target with ``os.replace``. Temporary files are named ``.<name>.<random><TMP_SUFFIX>`` so a run that
was killed mid-write can find and remove its leftovers. Files get the mode a plain ``open`` would give
under the current umask (``mkstemp`` alone would make them private).

A link already at the target is replaced by the new file; its target is never written. :class:`Staged`
writes several files side by side first and renames them into place only once all were written, so a
full disk or a failed plot leaves the previous files (or none) instead of half a report.

Every command writes all its files through this module (tables, summaries, plots, unit files,
checkpoints), inside :func:`confined` to its output folder: there a link planted where a file or a
subfolder belongs is replaced (the link removed, its target left alone), never followed, so nothing is
written outside the folder. :func:`check_output_folder` refuses an existing folder that holds files the
command did not write, before any work starts.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pandas as pd

from auditor.core.errors import AuditError

TMP_SUFFIX = ".tmp"


def new_file_mode() -> int:
    """Mode of a newly created regular file under the current umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# the output folder of the command running now: below it, links are replaced by real folders
_ROOT: contextvars.ContextVar[Path | None] = contextvars.ContextVar("auditor_output_root", default=None)


@contextlib.contextmanager
def confined(root: str | os.PathLike[str] | None) -> Iterator[None]:
    """Write the body's files as files of the output folder ``root`` (None: leave the setting alone).

    Inside, :func:`real_folder` (and so every write of this module) replaces a link planted at any level
    below ``root`` by a real folder. ``root`` itself may be a link the user chose."""
    if root is None:
        yield
        return
    token = _ROOT.set(Path(os.path.abspath(root)))
    try:
        yield
    finally:
        _ROOT.reset(token)


def output_root() -> Path | None:
    """The folder set by the innermost :func:`confined` (None outside one)."""
    return _ROOT.get()


def real_folder(folder: str | os.PathLike[str]) -> Path:
    """Create ``folder`` (and missing parents); return it.

    Inside :func:`confined`, every level of ``folder`` below the output folder is a real folder: a link
    there is removed (its target is left alone) and replaced by a new empty folder; a file there is an
    ``OSError`` naming it. Outside, a plain ``mkdir -p``."""
    folder = Path(folder)
    root = _ROOT.get()
    absolute = Path(os.path.abspath(folder))
    if root is None or (absolute != root and root not in absolute.parents):
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    root.mkdir(parents=True, exist_ok=True)
    current = root
    for part in absolute.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            current.unlink()  # a planted link: removed, never followed
        try:
            current.mkdir()
        except FileExistsError:
            if not current.is_dir() or current.is_symlink():
                raise NotADirectoryError(
                    errno.ENOTDIR, "a file is where a folder belongs", str(current)
                ) from None
    return folder


def temporary_path(path: Path) -> Path:
    """A new empty temporary file next to ``path`` (same file system, so the final rename is atomic)."""
    real_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    os.fchmod(fd, new_file_mode())
    os.close(fd)
    return Path(tmp)


def _named(err: OSError, path: Path) -> OSError:
    """``err`` naming ``path`` when it names no file (a full disk's ENOSPC arrives from ``write`` without one)
    or only the temporary one."""
    if err.errno is not None and (err.filename is None or str(err.filename).endswith(TMP_SUFFIX)):
        return type(err)(err.errno, err.strerror or os.strerror(err.errno), str(path))
    return err


def _write_synced(tmp: Path, text: str) -> None:
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    path = Path(path)
    try:
        tmp = temporary_path(path)
    except OSError as err:
        raise _named(err, path.parent) from None
    try:
        _write_synced(tmp, text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _named(err, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_csv_atomic(frame: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write ``frame`` to ``path`` as CSV (no index) atomically."""
    write_text_atomic(path, frame.to_csv(index=False))


def write_atomic(path: str | os.PathLike[str], writer: Callable[[Path], object]) -> Path:
    """Fill a temporary next to ``path`` with ``writer(temporary path)`` (e.g. ``fig.savefig``,
    ``torch.save``), sync it and rename it over ``path``; returns ``path``."""
    with Staged() as staged:
        staged.write(path, writer)
        return staged.commit()[0]


def save_figure(fig: object, path: str | os.PathLike[str], **savefig: object) -> Path:
    """``fig.savefig`` into ``path`` atomically, in the format of its suffix (``.png``, ``.pdf``, ...)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    return write_atomic(path, lambda tmp: fig.savefig(tmp, format=fmt, **savefig))


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
        try:
            tmp = temporary_path(path)
        except OSError as err:
            raise _named(err, path.parent) from None
        self._pending.append((tmp, path))
        try:
            writer(tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        except OSError as err:
            raise _named(err, path) from None
        return path

    def text(self, path: str | os.PathLike[str], text: str) -> Path:
        """Stage ``text`` as the new content of ``path``."""
        return self.write(path, lambda tmp: _write_synced(tmp, text))

    def commit(self) -> list[Path]:
        """Rename every staged file over its target (replacing a link, never writing through it)."""
        done = []
        while self._pending:
            tmp, path = self._pending[0]
            try:
                os.replace(tmp, path)
            except OSError as err:
                raise _named(err, path) from None
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


def foreign_entries(folder: str | os.PathLike[str], owns: Callable[[str], bool]) -> list[str]:
    """Sorted names of the visible entries of ``folder`` that ``owns(name)`` does not claim ([] when
    ``folder`` is not a folder). Hidden entries are left out: no command writes or removes them, except
    its own lock and temporaries."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(name for name in names if not name.startswith(".") and not owns(name))


def refuse_foreign(folder: str | os.PathLike[str], foreign: Iterable[str], command: str, valid: str) -> None:
    """Raise the one-line AuditError for an existing ``--out`` holding ``foreign`` entries (if any)."""
    foreign = list(foreign)
    if not foreign:
        return
    shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    raise AuditError(f"--out {str(folder)!r} already holds files that {command} did not write ({shown}); "
                     f"give a new or empty folder{valid}")


def check_output_folder(folder: str | os.PathLike[str], owned: Iterable[str], command: str) -> None:
    """Refuse an existing ``folder`` that holds visible entries other than the files ``owned`` (names; a
    ``.png`` in it also owns the ``.pdf`` of the same stem) that ``command`` writes."""
    names = set(owned) | {name.removesuffix(".png") + ".pdf" for name in owned if name.endswith(".png")}
    refuse_foreign(folder, foreign_entries(folder, names.__contains__), command,
                   f", or one holding only the files {command} writes ({', '.join(sorted(owned))})")
