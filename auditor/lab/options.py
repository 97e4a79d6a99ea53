"""The lab's scalar option types and ``--threads``: shared by the command-line layer
(:mod:`auditor.lab.cli`) and the rooms' own click tools (``audit facts generate``), which build their
options from here rather than from the CLI layer above them.

A scalar seed is a :data:`SEED`, a size a :data:`SIZE`, a step count a :data:`STEPS` (their lower bounds
are the configs' own checks); ``--threads`` sets torch's intra-op threads for one command and restores
them afterwards.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import click
import torch

from auditor.core.errors import AuditError
from auditor.core.options import MAX_SEED, MAX_SIZE, MAX_STEPS

MAX_THREADS = 1024
SEED = click.IntRange(0, MAX_SEED)  # a scalar seed option (lists: auditor.core.options.parse_seeds)
SIZE = click.IntRange(max=MAX_SIZE)  # a scalar size option; its lower bound is the config's own check
STEPS = click.IntRange(max=MAX_STEPS)  # a step count (--steps, --eval-every); its lower bound is the config's
THREADS_HELP = "torch intra-op threads for this run [default: torch's default, one per core]"


def check_threads(threads: int | None) -> None:
    """None (torch's default) or an integer in 1 .. MAX_THREADS, else a one-line AuditError."""
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise AuditError(
            f"--threads takes an integer in 1..{MAX_THREADS} (or leave it out for one per core); "
            f"got {threads}"
        )


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
