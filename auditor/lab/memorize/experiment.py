"""``audit memorize``: attention layers memorizing random labels, swept over H, n, d_h, N and seeds.

Presets are the panels of Paper A's Figure 2 (``--figure a|b|c``; classification, 100 classes, shared
context): (a) memorization against H, (b) against n, (c) against d_h, several N per panel. ``paper``
lists the paper's values and step rule (d = 64, n = 32, max(500 epochs, 50,000) steps, 300,000 for the
d_h panel, lr 1e-3, batch 256; a GPU job); ``reference`` (the committed reports) keeps the design with
d = 16, n = 8, N in {512, 1024}, 2000 steps of batch 512 at lr 1e-2, minutes on two CPU cores;
``quick`` is a seconds-long smoke test. Without ``--figure`` the lists ``--heads --context --d-h --N``
span the grid; with it they keep only the listed values of the panel.

Every run trains to convergence (rounds of ``--steps``, see
:func:`~auditor.lab.common.mha.train.train_rounds`); runs stopped at the step limit are flagged and left
out of the means and fits, which are reported over three seeds by default with 95% Student-t intervals
(``summary.csv``, ``fits.csv``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from auditor.core.errors import AuditError
from auditor.lab.common.mha import plots, train
from auditor.lab.common.mha.data import TASKS
from auditor.lab.common.mha.model import VARIANTS
from auditor.lab.common.mha.train import MemorizeRun, MemorizeSettings, grid, make_units
from auditor.lab.experiment import Experiment, option, table
from auditor.lab.stats import intervals
from auditor.lab.sweep import write_table

FIGURES = ("a", "b", "c")
SWEPT = ("heads", "context", "d_h", "N")
_PANELS = {  # scale -> (d, n, training settings, panel -> (swept axis, lists))
    "paper": (
        64,
        32,
        {"lr": 1e-3, "batch_size": 256, "eval_every": 500},
        {
            "a": (
                "heads",
                dict(
                    heads=[1, 5, 10, 20, 30, 40, 50, 60],
                    context=[32],
                    d_h=[64],
                    N=[10_000, 20_000, 30_000, 40_000],
                ),
            ),
            "b": (
                "context",
                dict(
                    heads=[20],
                    context=[1, 5, 10, 20, 30, 40, 50, 60],
                    d_h=[64],
                    N=[6000, 10_000, 14_000, 18_000],
                ),
            ),
            "c": (
                "d_h",
                dict(
                    heads=[30],
                    context=[32],
                    d_h=[10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 64],
                    N=[10_000, 20_000],
                ),
            ),
        },
    ),
    "reference": (
        16,
        8,
        {"steps": 2000, "lr": 1e-2, "batch_size": 512, "eval_every": 50},
        {
            "a": ("heads", dict(heads=[1, 2, 3, 4, 6, 8], context=[8], d_h=[16], N=[512, 1024])),
            "b": ("context", dict(heads=[4], context=[1, 2, 4, 6, 8, 12, 16], d_h=[16], N=[512, 1024])),
            "c": ("d_h", dict(heads=[6], context=[8], d_h=[1, 2, 4, 6, 8, 12, 16], N=[512, 1024])),
        },
    ),
    "quick": (
        8,
        4,
        {"steps": 100, "lr": 1e-2, "batch_size": 64, "eval_every": 20},
        {
            "a": ("heads", dict(heads=[1, 2], context=[4], d_h=[8], N=[64])),
            "b": ("context", dict(heads=[2], context=[2, 4], d_h=[8], N=[64])),
            "c": ("d_h", dict(heads=[2], context=[4], d_h=[2, 8], N=[64])),
        },
    ),
}
_GRID_TRAINING = {"steps": 3000, "lr": 1e-2, "batch_size": 512, "eval_every": 50}  # without --figure
# the MemorizeSettings fields a memorize-style config may set as options of the same name
_SETTINGS = ("steps", "lr", "batch_size", "eval_every", "error_tolerance", "bucket_size", "certify", "device",
             "rounds", "plateau")
ROUNDS_HELP = ("Max training rounds; a run that has not memorized every example trains another cycle "
               "from its weights until a round gains at most --plateau x N examples.")


def settings_option(name: str, help: str | None = None) -> Any:
    """A config option that sets the :class:`MemorizeSettings` field ``name``: that field's default and
    command-line spelling, and its help unless ``help`` is given."""
    (f,) = (f for f in fields(MemorizeSettings) if f.name == name)
    cli = {k: v for k, v in f.metadata.items() if k != "help"}
    return option(f.default, help or f.metadata["help"], **cli)


def training_settings(config: Any, preset: Mapping[str, Any] | None = None) -> MemorizeSettings:
    """The training settings of a memorize-style ``config``: the ``preset`` values, overridden by the
    config's options named as MemorizeSettings fields that are set (not None)."""
    given = {k: getattr(config, k) for k in _SETTINGS if getattr(config, k, None) is not None}
    return MemorizeSettings(**{**(preset or {}), **given})


@dataclass(frozen=True)
class MemorizeConfig:
    """What ``audit memorize`` runs: a Figure 2 panel or a grid, and how it trains."""

    figure: str | None = option(None, "Preset of Paper A's Figure 2 panel: a (vs H), b (vs n), c (vs d_h).",
                                choices=FIGURES)
    heads: tuple[int, ...] | None = option(
        None, "H values, e.g. 1,2,4 or 1:8 (with --figure: keep only these)."
    )
    context: tuple[int, ...] | None = option(None, "n values (context rows).")
    d_h: tuple[int, ...] | None = option(None, "Key/query widths d_h.")
    N: tuple[int, ...] | None = option(None, "Dataset sizes N.", flag="--N")
    seeds: tuple[int, ...] = option(
        (0, 1, 2), "Seeds (data and initialisation); means carry 95% t intervals."
    )
    d: int = option(16, "Token width d (without --figure).")
    d_v: int | None = option(None, "Value width (default d_h; 1 for --variant authors).")
    task: str = option("classification", "Random class labels or regression targets.", choices=TASKS)
    classes: int = option(100, "Classes (classification).")
    outputs: int = option(1, "Label width (regression).")
    error_tolerance: float = option(
        0.05, "Regression: |error| <= this is memorized; in (0, 0.5) (labels lie in [0, 1))."
    )
    shared_context: bool = option(
        True, "One context for all examples or one each.", flag="--shared/--non-shared"
    )
    variant: str = option("spec", "The layer of the theory or the authors' variant.", choices=VARIANTS)
    d_model: int | None = option(None, "Embedding width of --variant authors (default d).")
    steps: int | None = option(None, "Optimisation steps per round (one warm-up + cosine cycle).",
                               default_help="per preset; 3000 without --figure")
    lr: float | None = option(
        None, "Peak Adam learning rate.", parse="floats", default_help="per preset; 1e-2"
    )
    batch_size: int | None = option(None, "Minibatch size; N <= batch trains full-batch.",
                                    default_help="per preset; 512")
    eval_every: int | None = option(
        None, "Full-set accuracy (early stop) every k steps.", default_help="per preset; 50"
    )
    rounds: int = settings_option("rounds", ROUNDS_HELP)
    plateau: float = settings_option("plateau")
    bucket_size: int = settings_option("bucket_size")
    certify: bool = settings_option("certify")
    device: str = settings_option("device")
    scale: str = "reference"

    def __post_init__(self) -> None:
        if self.figure is None and any(getattr(self, k) is None for k in SWEPT):
            missing = ", ".join("--" + k.replace("_", "-") for k in SWEPT if getattr(self, k) is None)
            raise AuditError(f"give {missing} (or a preset with --figure a|b|c)")
        if not self.plan()[0]:
            raise AuditError(
                "the values given select none of the preset's runs; leave them out or pick listed ones"
            )

    def plan(self) -> tuple[list[MemorizeRun], MemorizeSettings, str, str]:
        """(runs, training settings, swept axis, note) of this config."""
        if self.figure is not None:  # the panel at this scale, keeping only the values given
            d, n, base, panels = _PANELS[self.scale]
            x, values = panels[self.figure]
            if self.scale == "paper":
                base = {
                    **base,
                    "steps": 300_000 if self.figure == "c" else train.paper_steps(max(values["N"])),
                }
            keep = {k: set(getattr(self, k)) for k in SWEPT if getattr(self, k) is not None}
            runs = [
                r
                for r in grid(
                    values["heads"],
                    values["context"],
                    values["d_h"],
                    values["N"],
                    self.seeds,
                    d=d,
                    classes=100,
                    shared_context=True,
                )
                if all(getattr(r, k) in vals for k, vals in keep.items())
            ]
            settings = training_settings(self, base)
            note = (
                f"{self.scale} scale: d = {d}, n = {n}, 100 classes, shared context, N in {values['N']}, "
                f"rounds of {settings.steps} steps (at most {self.rounds}) of batch {settings.batch_size} "
                f"at lr {settings.lr}"
                + (
                    ""
                    if self.scale == "paper"
                    else " (the paper: d = 64, n = 32, N in the tens of thousands, >= 50,000 steps of batch "
                         "256 at lr 1e-3)"
                )
            )
        else:
            runs = grid(
                self.heads,
                self.context,
                self.d_h,
                self.N,
                self.seeds,
                d=self.d,
                d_v=self.d_v,
                task=self.task,
                classes=self.classes,
                outputs=self.outputs,
                shared_context=self.shared_context,
                variant=self.variant,
                d_model=self.d_model,
            )
            settings, note = training_settings(self, _GRID_TRAINING), ""
            x = max(("heads", "context", "d_h"), key=lambda k: len(getattr(self, k)))
        return runs, settings, x, note

    @property
    def note(self) -> str:
        return self.plan()[3]


def _units(config: MemorizeConfig, out: Path) -> list[dict[str, Any]]:
    runs, settings, _, _ = config.plan()
    return make_units(runs, settings, out)


def _plots(frame: pd.DataFrame, out: Path, config: MemorizeConfig) -> list[Path]:
    x = config.plan()[2]
    plots.plot_sweep(frame, x, out / f"memorized_vs_{x}.png")
    best = frame.sort_values(["heads", "memorized"], ascending=False).iloc[0]  # most heads among the best
    records = pd.read_csv(out / best["saturation"])
    plots.plot_saturation(records[records["member"] == best["member"]], out / "saturation.png",
                          title=f"saturation: H={best['heads']}, n={best['context']}, d_h={best['d_h']}, "
                                f"N={best['N']}, seed {best['seed']}, memorized {best['memorized']}")
    return [out / f"memorized_vs_{x}.png", out / "saturation.png"]


def _report(frame: pd.DataFrame, out: Path, config: MemorizeConfig) -> str:
    x = config.plan()[2]
    provenance = {"device": str(frame["device"].iloc[0]), "seed": ",".join(map(str, config.seeds))}
    summary = plots.sweep_summary(frame, x)
    write_table(summary.assign(x=x), out / "summary.csv", **provenance)
    fits = plots.sweep_fits(frame, x)
    if not fits.empty:
        write_table(fits.assign(x=x, unsaturated_below=plots.UNSATURATED), out / "fits.csv", **provenance)
    shown = summary.assign(memorized=intervals(summary, "memorized_mean", "memorized_low", "memorized_high"))
    columns = ["N", x, "memorized", "lower_bound", "guaranteed_mean", "readout_hits_mean", "seeds", "runs"]
    text = (
        "Memorized examples over the converged seeds, mean [95% t interval]; runs = all seeds, seeds = those "
        "that converged (the others stopped at the step limit and are left out):\n\n" + table(shown, columns)
    )
    if not fits.empty:
        text += (
            "\n\nLinear fit of memorized against H on the unsaturated points, per seed, then over seeds:\n\n"
        )
        text += table(fits.assign(slope=intervals(fits, "slope", "slope_low", "slope_high")),
                      ["N", "slope", "intercept", "r2", "points", "seeds"])
    stopped = frame[~frame["converged"].astype(bool)]
    if len(stopped):
        text += "\n\nStopped at the step limit (raise --steps or --rounds):\n\n" + table(
            stopped, ["heads", "context", "d_h", "N", "seed", "memorized", "rounds_trained", "steps_trained"])
    return text + (f"\n\nresults: {out / 'results.csv'}; summary: {out / 'summary.csv'}; "
                   f"plot: {out / f'memorized_vs_{x}.png'}")


EXPERIMENT = Experiment(
    name="memorize",
    help="Train attention layers to memorize random labels; sweep H, n, d_h, N and seeds.",
    examples="audit memorize --figure a                 # Figure 2(a) at the reference scale (minutes)\n"
    "audit memorize --heads 1:8 --context 8 --d-h 16 --N 512 --seeds 0,1",
    config=MemorizeConfig,
    units=_units,
    run_unit=train.run_unit,
    columns=train.COLUMNS,
    plots=_plots,
    report=_report,
    presets={
        "quick": {"figure": "a", "seeds": (0,), "rounds": 2}
    },  # the other scales keep --figure optional; the config reads its scale
    scale_names=("quick", "reference", "paper"),
    key_defaults=train.KEY_DEFAULTS,
)
