"""The one command-line layer of the capacity lab: every lab command is built here, from its room
(:class:`~auditor.lab.room.Room`) and its :class:`~auditor.lab.experiment.Experiment`.

A command takes its config's options (lists as ``1,2,4`` or inclusive ranges ``1:8`` / ``0:60:10``) and
the common options, with one meaning everywhere: ``--scale`` (a preset; reference: what the committed
reports used), ``--seeds``, ``--out`` (a folder; rerun to resume), ``--executor``, ``--address``,
``--slurm-*``, ``--threads`` (restored afterwards) and ``--plots/--no-plots``. It validates every option
before it creates its output folder (:func:`output_folder`: a failed run removes the folders it created unless
a finished unit or a checkpoint lies inside).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from auditor.core.atomic import confined, foreign_entries, refuse_foreign, write_text_atomic
from auditor.core.errors import AuditError
from auditor.core.execution import EXECUTORS, check_executor
from auditor.core.options import parse_floats, parse_ints, parse_seeds, parse_sizes, parse_steps
from auditor.core.provenance import timestamp
from auditor.core.slurm import click_options as slurm_options
from auditor.core.slurm import pop_options as pop_slurm_options
from auditor.lab import room as registry
from auditor.lab.experiment import SCALES, Experiment, Option, run_experiment
from auditor.lab.options import SEED, SIZE, STEPS, THREADS_HELP, torch_threads
from auditor.lab.room import Room
from auditor.lab.sweep import missing_parents, remove_empty

SEEDS_HELP = "Seeds of the repetitions, e.g. 0,1,2 or 0:4"
_STEP_COUNTS = ("steps", "eval_every")  # bounded by MAX_STEPS, not MAX_SIZE


def default_out(out: str | None, name: str) -> Path:
    """``--out`` as a path, or ``runs/<name>-<time>`` when it is not given."""
    return Path(out) if out else Path("runs") / f"{name}-{timestamp()}"


def _holds_progress(folder: Path) -> bool:
    """Whether a finished sweep unit, a training checkpoint or the record of submitted Slurm jobs (which go
    on without this process and write their units here) lies under ``folder``."""
    return any(p.is_file() for pattern in ("units/*.json", "checkpoints/*", "slurm/jobs.json")
               for p in folder.rglob(pattern))


def _earlier_run(folder: Path) -> bool:
    """Whether ``folder`` holds the sweep units or checkpoints of an earlier lab run (up to two levels
    down: experiments that keep a subfolder per sweep)."""
    return any(
        p.is_dir()
        for name in ("units", "checkpoints")
        for pattern in (name, f"*/{name}", f"*/*/{name}")
        for p in folder.glob(pattern)
    )


def check_lab_folder(path: Path) -> None:
    """Refuse an existing ``--out`` holding visible files unless an earlier lab run left its units there."""
    if path.is_dir() and not _earlier_run(path):
        refuse_foreign(path, foreign_entries(path, lambda name: False), "this command",
                       ", or the folder of an earlier run of a lab command to resume it")


@contextlib.contextmanager
def output_folder(path: Path) -> Iterator[Path]:
    """Create ``path`` (and missing parents) for the body, whose files are written confined to it (see
    :func:`auditor.core.atomic.confined`); if the body raises, remove what was created here unless it holds
    progress a rerun would resume from. A folder that existed is never removed; one that holds files but
    no earlier run is refused."""
    path = Path(path)
    check_lab_folder(path)
    created = missing_parents(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AuditError(
            f"cannot create output folder {str(path)!r} ({err.strerror}); choose a writable --out"
        ) from None
    try:
        with confined(path):
            yield path
    except BaseException:
        if created and not _holds_progress(created[-1]):
            shutil.rmtree(created[-1], ignore_errors=True)
        else:
            remove_empty(created)
        raise


# -- options from config fields ---------------------------------------------------------------------
def _flag(opt: Option) -> str:
    return opt.field.metadata.get("flag") or "--" + opt.field.name.replace("_", "-")


def _dest(opt: Option) -> str:
    """The name a command passes the option's value under (its flag's, so members of a suite agree)."""
    return _flag(opt).split("/")[0].lstrip("-").replace("-", "_")


def _kind(opt: Option) -> Any:
    """The field's type with ``| None`` removed."""
    hint = typing.get_type_hints(opt.owner)[opt.field.name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return "none" if value is None else str(value)


def _param(opt: Option) -> click.Parameter:
    """The click parameter of an option field: lists are read later (:func:`parse`), scalars by click."""
    meta, kind, flag, name = opt.field.metadata, _kind(opt), _flag(opt), _dest(opt)
    help = f"{meta['help']} [default: {meta.get('default_help') or _shown(opt.field.default)}]"
    if meta.get("argument"):
        return click.Argument([name], required=False)
    if kind is bool:
        return click.Option(
            [flag if "/" in flag else f"{flag}/--no-{flag[2:]}", name], default=None, help=help
        )
    if meta.get("multiple"):
        return click.Option([flag, name], multiple=True, help=help)
    if meta.get("choices"):
        kind = click.Choice(meta["choices"])
    elif kind is int:
        kind = SEED if "seed" in opt.field.name else STEPS if opt.field.name in _STEP_COUNTS else SIZE
    elif kind is not float or meta.get("parse") == "floats":
        kind = str
    return click.Option([flag, name], type=kind, default=None, help=help)


def parse(opt: Option, raw: Any) -> Any:
    """An option's value from its command-line text (lists: commas and ranges)."""
    kind, flag = _kind(opt), _flag(opt)
    if not isinstance(raw, str) or opt.field.metadata.get("choices"):
        return tuple(raw) if isinstance(raw, tuple | list) else raw
    if kind is float:  # parse="floats": one positive number, read like a list
        values = parse_floats(raw, flag, positive=True)
        if len(values) != 1:
            raise AuditError(f"{flag} takes one number here, got {raw!r}")
        return values[0]
    if typing.get_origin(kind) is not tuple:
        return raw
    item = typing.get_args(kind)[0]
    unique = not opt.field.metadata.get("per_item")  # one value per item of another list: repeats kept
    if item is float:
        return tuple(parse_floats(raw, flag, positive=True, unique=unique))
    if item is str:
        names = tuple(n.strip() for n in raw.split(",") if n.strip())
        if not names:
            raise AuditError(f"{flag} lists no values; give e.g. a,b")
        return names
    how = opt.field.metadata.get("parse") or ("seeds" if "seed" in opt.field.name else "sizes")
    parser = {"seeds": parse_seeds, "sizes": parse_sizes, "steps": parse_steps, "ints": parse_ints}[how]
    return tuple(parser(raw, flag, unique=unique))


def _common_options(experiment: Experiment | None, options: list[Option]) -> list[click.Parameter]:
    scales = experiment.scales if experiment else SCALES
    params = [
        click.Option(
            ["--scale"],
            default="reference",
            show_default=True,
            help=f"Preset: {' | '.join(scales)} (reference: the committed reports' settings).",
        ),
        click.Option(
            ["--out"], default=None, help="Output folder [default: runs/<command>-<time>]; rerun to resume."
        ),
        click.Option(
            ["--executor"],
            type=click.Choice(EXECUTORS),
            default="local",
            show_default=True,
            help="Run the sweep units in this process, as Ray tasks or as one Slurm job array.",
        ),
        click.Option(["--address"], default=None, help="Ray cluster address for --executor ray (e.g. auto)."),
        *slurm_options(),
        click.Option(["--threads"], type=int, default=None, help=THREADS_HELP),
        click.Option(["--plots/--no-plots"], default=True, show_default=True, help="Draw the PNG figures."),
    ]
    if not any(_dest(o) == "seeds" for o in options):
        params.insert(
            1, click.Option(["--seeds"], default=None, help=f"{SEEDS_HELP} (this command has none).")
        )
    return params


def _given(experiment: Experiment, values: dict[str, Any]) -> dict[str, Any]:
    """Parsed values of the options the user gave."""
    options = {_dest(o): o for o in experiment.options()}
    given = {
        o.field.name: parse(o, values[dest])
        for dest, o in options.items()
        if values.get(dest) not in (None, ())
    }
    if values.get("seeds") is not None and "seeds" not in options:
        raise AuditError(f"{experiment.name} has nothing to seed (its settings are fixed); leave out --seeds")
    return given


def _run(experiments: list[Experiment], name: str, values: dict[str, Any]) -> None:
    """The body of every lab command: options checked, then the folder, then the experiments."""
    with torch_threads(values.pop("threads")):
        scale = values.pop("scale")
        out, executor, address, plots = (values.pop(k) for k in ("out", "executor", "address", "plots"))
        check_executor(executor)
        slurm = pop_slurm_options(values).check_executor(executor)
        configs = []
        for e in experiments:  # a suite member keeps the options its config lists in SUITE_FIXED
            fixed = getattr(e.config, "SUITE_FIXED", ()) if len(experiments) > 1 else ()
            configs.append(e.make(scale, **_given(e, {k: v for k, v in values.items() if k not in fixed})))
        folder = default_out(out, name.replace(" ", "-"))
        with output_folder(folder):
            texts = []
            for e, config in zip(experiments, configs):
                note = getattr(config, "note", "")
                texts.append(
                    run_experiment(
                        e, config, folder, executor=executor, address=address, plots=plots, slurm=slurm
                    )[1]
                )
                # said once the run is done: a refused run prints its one error line and nothing else
                click.echo(f"{e.name} ({scale}) -> {folder}" + (f"\n{note}" if note else ""), err=True)
            if len(experiments) > 1:
                write_text_atomic(folder / "summary.md", "\n\n".join(texts) + "\n")
                given = {k: v for k, v in values.items() if v not in (None, ())}
                write_text_atomic(folder / "settings.json", json.dumps({"scale": scale, **given}) + "\n")
    click.echo("\n\n".join(texts))


def command(name: str, *, cls: type[click.Command] = click.Command, **attrs: Any) -> click.Command:
    """The click command of an experiment or suite (``facts width``, ``recall all``, ``memorize``)."""
    suites = registry.suites()
    members = [registry.get(n) for n in suites.get(name, (name,))]
    first = members[0]
    if name in suites:
        names = [{_dest(o) for o in e.options()} for e in members]
        options = [o for o in first.options() if all(_dest(o) in n for n in names)]
        help_text = (f"Run {', '.join(e.name for e in members)} into one folder (summary.md holds their "
                     "summaries); the options apply to each that has them.")
        params = [_param(o) for o in options] + _common_options(None, options)
    else:
        options = first.options()
        help_text = first.help + (f"\n\n\b\n{first.examples}" if first.examples else "")
        params = [_param(o) for o in options] + _common_options(first, options)

    def callback(**values: Any) -> None:
        ctx = click.get_current_context()
        if ctx.invoked_subcommand is None:
            _run(members, name, values)
            return
        # a room's subcommand (`audit memorize shared-queries`): options before it would be ignored;
        # refuse them
        given = [p.opts[0] for p in ctx.command.params if p.name and ctx.get_parameter_source(p.name)
                 is not click.core.ParameterSource.DEFAULT]
        if given:
            raise AuditError(
                f"{', '.join(given)} before '{ctx.invoked_subcommand}' belong to 'audit {name}' itself; "
                f"give the options after it: audit {name} {ctx.invoked_subcommand} [OPTIONS]"
            )

    return cls(name.split()[-1], params=params, help=help_text, callback=callback,
               context_settings={"help_option_names": ["-h", "--help"]}, **attrs)


class _Room(click.Group):
    """A room with subcommands (``audit facts width``), found in its :class:`Room` and built when used.
    A room with an experiment of its own name runs it when no subcommand is given (``audit memorize
    --figure a``; ``audit memorize shared-queries``)."""

    def __init__(self, name: str, *, room: Room, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.room = room

    def _names(self) -> list[str]:
        return self.room.subcommands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self._names()

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.room.tools:
            return registry.load(self.room.tools[name])
        return command(self.room.full(name)) if name in self._names() else None


def room_command(room: Room) -> click.Command:
    """The command of a room: its experiment's command when that is all it holds (``audit certify``), else a
    group of its experiments, suites and tools, which runs the room's own experiment (if it has one) when no
    subcommand is given."""
    if not room.subcommands:
        return command(room.name)
    if room.name in room.experiments:
        return command(room.name, cls=_Room, room=room, invoke_without_command=True,
                       subcommand_metavar="[COMMAND [ARGS]...]")
    return _Room(
        room.name, room=room, help=room.help, context_settings={"help_option_names": ["-h", "--help"]}
    )


def lab_command(name: str) -> click.Command:
    """The click command of ``audit <name>``: a lab-wide tool (``bits``) or a room."""
    from auditor.lab import TOOLS

    if name in TOOLS:
        return registry.load(TOOLS[name][0])
    return room_command(registry.get_room(name))


def lab_commands() -> dict[str, click.Command]:
    """Every command of every room by its full name (``memorize``, ``memorize shared-queries``,
    ``facts width``, ``facts generate``, ``recall all``): the rooms' experiments, suites and tools."""
    out: dict[str, click.Command] = {}
    for room in registry.rooms().values():
        built = room_command(room)
        if room.name in room.experiments:
            out[room.name] = built
        if isinstance(built, click.Group):
            out.update({room.full(n): built.get_command(click.Context(built), n) for n in room.subcommands})
    return out
