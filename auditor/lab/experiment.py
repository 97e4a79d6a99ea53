"""One contract for every capacity experiment, and the one runner that runs it.

An :class:`Experiment` declares

* ``config``: a frozen dataclass whose fields made with :func:`option` are its command-line options
  (validated in ``__post_init__``, so a bad value fails before any folder exists);
* ``units(config, out)``: how a run splits into sweep units (JSON dicts; ``out`` is the output folder,
  for units that keep side files there);
* ``run_unit(unit)``: a module-level function that runs one unit and returns its rows;
* ``key_defaults``: the defaults of the units' entries (:func:`auditor.lab.sweep.key_fields`); an entry at
  its default is left out of the unit's resume key, so a field added with a default re-keys no
  finished unit (declare a unit's dataclasses here rather than spelling their defaults out);
* ``columns``: the row schema (the runner refuses other columns and writes them in this order);
* ``plots`` and ``report``: the figures, and the extra files plus the text printed after a run;
* ``presets``: named scales (``quick``, ``reference`` = the defaults, ``paper``) as field overrides.

:func:`run_experiment` does the rest once for all: the sweep (:func:`auditor.lab.sweep.run_sweep`:
execution, resume, provenance, ``results.csv``), then the report and the plots. The command line
(:mod:`auditor.lab.cli`) builds every lab command from the same declaration.

Adding an experiment: write its file (config, units, unit function, columns, ``EXPERIMENT =
Experiment(...)``) and add one line to its room's ``experiments`` (:mod:`auditor.lab.room`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from auditor.core.errors import did_you_mean
from auditor.core.slurm import SlurmOptions

SCALES = ("quick", "reference", "paper")


def option(default: Any, help: str, **cli: Any) -> Any:
    """A config field that is also a command-line option (``--name-with-dashes``).

    Keywords: ``flag`` (the spelling, e.g. ``"--shared/--non-shared"``), ``choices``, ``argument``
    (positional), ``multiple`` (repeatable), ``parse`` (``sizes``, ``seeds``, ``ints``, ``steps``,
    ``floats``, ``names``: how a list is read; default from the field type), ``per_item`` (a list with one
    value per item of another list: repeated values kept), ``default_help`` (shown instead of the
    default).
    """
    return field(default=default, metadata={"help": help, **cli})


@dataclass(frozen=True)
class Experiment:
    """A capacity experiment (see the module docstring)."""

    name: str
    help: str
    config: type
    units: Callable[[Any, Path], list[dict[str, Any]]]
    run_unit: Callable[[dict[str, Any]], list[dict[str, Any]]]
    columns: tuple[str, ...]
    plots: Callable[[pd.DataFrame, Path, Any], list[Path]] | None = None
    report: Callable[[pd.DataFrame, Path, Any], str] | None = None
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    folder: Callable[[dict[str, Any]], str] | None = None  # subfolder of a unit's sweep (default: out itself)
    key_defaults: Mapping[str, Any] | type = field(
        default_factory=dict
    )  # entries left out of a key at default
    show: tuple[str, ...] = ()  # columns of the table printed when there is no report
    examples: str = ""

    scale_names: tuple[str, ...] = ()  # the scales a config with a ``scale`` field resolves itself

    @property
    def scales(self) -> tuple[str, ...]:
        return self.scale_names or tuple(s for s in SCALES if s == "reference" or s in self.presets)

    def options(self) -> list[Option]:
        """The command-line options: option fields of the config and of its nested option dataclasses."""
        out = []
        for f in dataclasses.fields(self.config):
            if f.metadata.get("nested"):
                out += [
                    Option(f.default.__class__, g, f.name)
                    for g in dataclasses.fields(f.default)
                    if "help" in g.metadata
                ]
            elif "help" in f.metadata:
                out.append(Option(self.config, f, None))
        return out

    def make(self, scale: str = "reference", **given: Any) -> Any:
        """The config of ``scale``: the preset's fields, then ``given`` (nested fields by their own name)."""
        if scale not in self.scales:
            raise did_you_mean(f"scale of {self.name}", scale, self.scales)
        values = {k: dict(v) if isinstance(v, dict) else v for k, v in self.presets.get(scale, {}).items()}
        for opt in self.options():
            if opt.field.name in given and opt.parent:
                values.setdefault(opt.parent, {})[opt.field.name] = given.pop(opt.field.name)
        for f in dataclasses.fields(self.config):
            if f.metadata.get("nested") and isinstance(values.get(f.name), dict):
                values[f.name] = f.default.__class__(**values[f.name])
            if f.name == "scale":
                values["scale"] = scale
        return self.config(**{**values, **given})


@dataclass(frozen=True)
class Option:
    """A command-line option: ``field`` of the dataclass ``owner`` (nested under ``parent`` when given)."""

    owner: type
    field: dataclasses.Field
    parent: str | None


def run_experiment(experiment: Experiment, config: Any, out: str | Path, *, executor: str = "local",
                   address: str | None = None, plots: bool = True, progress: bool = True,
                   slurm: SlurmOptions | None = None) -> tuple[pd.DataFrame, str]:
    """Run (or resume) ``config`` into ``out``: the sweep, its report and plots; returns (rows, text).
    ``slurm``: the resources of each Slurm job under ``executor="slurm"`` (logs in each sweep's folder)."""
    from auditor.lab.sweep import run_sweep

    out = Path(out)
    units = experiment.units(config, out)
    groups: dict[str, list[dict[str, Any]]] = {}
    for unit in units:
        groups.setdefault(experiment.folder(unit) if experiment.folder else "", []).append(unit)
    frames = [
        run_sweep(
            experiment.run_unit,
            part,
            out / folder,
            executor=executor,
            address=address,
            slurm=slurm,
            progress=progress,
            desc=f"{experiment.name} {folder}".strip(),
            columns=experiment.columns,
            key_defaults=experiment.key_defaults,
        )
        for folder, part in groups.items()
    ]
    frame = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    if experiment.report is not None:  # first: it may write tables the plots read
        text = experiment.report(frame, out, config)
    else:
        text = table(frame, experiment.show) + f"\n\nresults: {out / 'results.csv'}"
    if plots and experiment.plots is not None:
        experiment.plots(frame, out, config)
    return frame, text


def table(frame: pd.DataFrame, columns: Sequence[str]) -> str:
    """The columns of ``frame`` that exist, as a Markdown table."""
    present = [c for c in columns if c in frame] or list(frame.columns)
    return frame[present].to_markdown(index=False, floatfmt=".4g")
