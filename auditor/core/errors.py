"""User-facing errors.

Every mistake a user can make (a bad option, a missing folder, a malformed file) raises
:class:`AuditError`, a ``ValueError`` whose message is one line that says what was wrong and what
is valid. The CLI turns it into ``error: <message>`` and exit code 2, never a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AuditError(ValueError):
    """A user mistake, reported as one line (exit code 2 on the command line)."""


def did_you_mean(kind: str, name: str, known: Iterable[str]) -> AuditError:
    """Build the error for an unknown ``name`` of ``kind``, with close matches and the valid choices."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
    return AuditError(f"unknown {kind} {name!r}; {hint}known: {', '.join(known)}")


def first_line(err: BaseException) -> str:
    """The first non-empty line of an exception message (errors are reported as one line)."""
    for line in str(err).splitlines():
        if line.strip():
            return line.strip()
    return type(err).__name__
