"""What every command of the capacity lab shares: ``--threads``, and the rule for the output folder.

* ``--threads N`` (:func:`threads_option`) sets torch's intra-op threads for the run and restores the
  previous number afterwards; without it torch keeps its default (one thread per core).
* A command validates every option before it creates its output folder, and creates it through
  :func:`output_folder`: a run that fails removes the folders it created, unless a finished sweep
  unit or a training checkpoint lies inside (those stay, so that rerunning the command resumes).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import torch

from auditor.errors import AuditError
from auditor.options import MAX_SEED, MAX_SIZE
from auditor.provenance import timestamp

MAX_THREADS = 1024
SEED = click.IntRange(0, MAX_SEED)  # a scalar seed option (lists: auditor.options.parse_seeds)
SIZE = click.IntRange(max=MAX_SIZE)  # a scalar size option; its lower bound is the room's own check
THREADS_HELP = "torch intra-op threads for this run [default: torch's default, one per core]"


def check_threads(threads: int | None) -> None:
    """None (torch's default) or an integer in 1 .. MAX_THREADS, else a one-line AuditError."""
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise AuditError(f"--threads takes an integer in 1..{MAX_THREADS} (or leave it out for one per core); "
                         f"got {threads}")


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the body with ``threads`` torch intra-op threads (None: leave torch's setting alone)."""
    check_threads(threads)
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def threads_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--threads`` to a click command; the command body runs under :func:`torch_threads`."""

    @functools.wraps(fn)
    def run(*args: Any, threads: int | None, **kwargs: Any) -> Any:
        with torch_threads(threads):
            return fn(*args, **kwargs)

    return click.option("--threads", type=int, default=None, help=THREADS_HELP)(run)


def default_out(out: str | None, name: str) -> Path:
    """``--out`` as a path, or ``runs/<name>-<time>`` when it is not given."""
    return Path(out) if out else Path("runs") / f"{name}-{timestamp()}"


def _missing(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


def _holds_progress(folder: Path) -> bool:
    """Whether a finished sweep unit or a training checkpoint lies under ``folder``."""
    return any(p.is_file() for pattern in ("units/*.json", "checkpoints/*") for p in folder.rglob(pattern))


@contextlib.contextmanager
def output_folder(path: Path) -> Iterator[Path]:
    """Create ``path`` (and missing parents) for the body; if the body raises, remove what was created
    here unless it holds progress a rerun would resume from. A folder that existed is never removed."""
    path = Path(path)
    created = _missing(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AuditError(f"cannot create output folder {str(path)!r} ({err.strerror}); choose a writable --out") from None
    try:
        yield path
    except BaseException:
        if created and not _holds_progress(created[-1]):
            shutil.rmtree(created[-1], ignore_errors=True)
        else:
            for folder in created:  # deepest first; stops at the first folder that is not empty
                try:
                    folder.rmdir()
                except OSError:
                    break
        raise
