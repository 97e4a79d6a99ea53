"""The rooms of the capacity lab, and the one list of them: the lab's subpackages.

A room is a package ``auditor/lab/<command>/`` (the folder is the command's name) whose ``__init__``
declares ``ROOM = Room(...)``: one line of help, its experiments (name -> ``"module:attribute"`` of an
:class:`~auditor.lab.experiment.Experiment`), the suites that run several of them into one folder, its
tools (other click commands, e.g. ``audit facts generate``) and the reader that counts the bits per
parameter of its results (:class:`BitsReader`). :func:`rooms` finds them by iterating the lab's
subpackages (all but :data:`SHARED`, the code that several rooms use); nothing else lists them. The
command line (:mod:`auditor.cli` through :mod:`auditor.lab.cli`), ``audit bits`` and the contract tests
all read this list.

The targets are strings, imported when used: a room's ``__init__`` imports nothing but this module, so
listing the rooms (``audit --help``) loads none of their code.

Adding an experiment: its file, and one line in its room's ``experiments``. Adding a room: a folder
with an ``__init__`` that declares ``ROOM``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditor.core.errors import AuditError, did_you_mean

if TYPE_CHECKING:
    import pandas as pd

    from auditor.lab.experiment import Experiment


@dataclass(frozen=True)
class BitsReader:
    """How ``audit bits`` counts a room's results.

    ``claims(columns)``: whether a result CSV with these columns is this room's (exactly one room may claim
    a CSV; a CSV no room claims holds nothing to count, e.g. a rank-only table). ``read(frame, file)``: its
    rows as ``room, experiment, config, stored_bits, parameters, formula, converged`` (plus the optional
    paper-A bound columns, see :mod:`auditor.lab.bits`); a missing column raises ``KeyError``.
    """

    claims: Callable[[set[str]], bool]
    read: Callable[[pd.DataFrame, Path], pd.DataFrame]


@dataclass(frozen=True)
class Room:
    """A room of the lab (see the module docstring).

    ``experiments`` maps a name to the ``"module:attribute"`` of its Experiment: the room's own name is
    ``audit <room>`` itself, any other name is ``audit <room> <name>``. ``suites`` map a name to experiment
    names of the room run together; ``tools`` map a name to the ``"module:attribute"`` of a click command;
    ``bits`` is the ``"module:attribute"`` of a :class:`BitsReader` (None: nothing stored to count).
    """

    name: str
    help: str
    experiments: Mapping[str, str]
    suites: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    tools: Mapping[str, str] = field(default_factory=dict)
    bits: str | None = None

    def __post_init__(self) -> None:
        if not self.experiments:
            raise AuditError(f"room {self.name!r} declares no experiment")
        names = [*self.experiments, *self.suites, *self.tools]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise AuditError(f"room {self.name!r} names {', '.join(clash)} twice (experiment, suite or tool)")
        for suite, members in self.suites.items():
            unknown = [m for m in members if m not in self.experiments]
            if unknown:
                raise did_you_mean(f"experiment in suite {self.full(suite)!r}", unknown[0], self.experiments)
        for target in [*self.experiments.values(), *self.tools.values(), *([self.bits] if self.bits else [])]:
            if target.count(":") != 1:
                raise AuditError(f"room {self.name!r}: {target!r} is not a 'module:attribute' reference")

    def full(self, name: str) -> str:
        """The command of an experiment, suite or tool of this room: ``facts width``, or ``memorize``."""
        return self.name if name == self.name else f"{self.name} {name}"

    @property
    def subcommands(self) -> list[str]:
        """The names run as ``audit <room> <name>``: experiments, suites, then tools."""
        return [n for n in [*self.experiments, *self.suites, *self.tools] if n != self.name]


FOLDERS = [str(Path(__file__).resolve().parent)]  # where the rooms are: the lab's own folder
SHARED = "common"  # auditor/lab/common: what several rooms use (a room imports no other room); not a room


def load(target: str) -> Any:
    """The object a ``"module:attribute"`` reference names (its module imported now)."""
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


@cache
def rooms() -> dict[str, Room]:
    """Every room, by command name: the ``ROOM`` of each subpackage of :mod:`auditor.lab`, in name order."""
    found: dict[str, Room] = {}
    for info in sorted(pkgutil.iter_modules(FOLDERS), key=lambda i: i.name):
        if not info.ispkg or info.name == SHARED:
            continue
        room = getattr(importlib.import_module(f"auditor.lab.{info.name}"), "ROOM", None)
        if not isinstance(room, Room):
            raise AuditError(f"auditor/lab/{info.name}/__init__.py declares no ROOM = Room(...); every "
                             f"subpackage of the lab but {SHARED}/ is a room")
        if room.name != info.name:
            raise AuditError(
                f"the room in auditor/lab/{info.name} is named {room.name!r}; a room's name is its "
                "folder's (and its command's)"
            )
        found[room.name] = room
    return found


def get_room(name: str) -> Room:
    """The room ``name`` (did-you-mean on a typo)."""
    if name not in rooms():
        raise did_you_mean("lab room", name, rooms())
    return rooms()[name]


def experiments() -> dict[str, str]:
    """Every experiment of every room: command (``facts width``) -> ``"module:attribute"``."""
    return {room.full(name): target for room in rooms().values() for name, target in room.experiments.items()}


def suites() -> dict[str, tuple[str, ...]]:
    """Every suite: command (``recall all``) -> the commands of its experiments."""
    return {room.full(name): tuple(room.full(m) for m in members)
            for room in rooms().values() for name, members in room.suites.items()}


def get(name: str) -> Experiment:
    """The experiment ``name`` (``memorize``, ``facts width``; did-you-mean on a typo)."""
    known = experiments()
    if name not in known:
        raise did_you_mean("experiment", name, known)
    return load(known[name])


def bits_readers() -> dict[str, BitsReader]:
    """Room name -> its bits reader, for the rooms that store something countable."""
    return {room.name: load(room.bits) for room in rooms().values() if room.bits}
