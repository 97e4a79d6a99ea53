"""``audit assoc`` (associative-memory capacity) and ``audit recall`` (factual recall) commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pandas as pd

from auditor.atomic import write_csv_atomic
from auditor.errors import AuditError
from auditor.lab.assoc import plots, presets, summary
from auditor.lab.assoc.dynamics import DynamicsConfig, run_dynamics
from auditor.lab.assoc.memory_sweep import AssocConfig, run_assoc
from auditor.lab.assoc.recall_sweep import (
    RecallTraining,
    ScalingConfig,
    TradeoffConfig,
    run_scaling,
    run_tradeoff,
)
from auditor.lab.cli import default_out, output_folder, threads_option
from auditor.lab.sweep import EXECUTORS, check_executor
from auditor.options import parse_floats, parse_seeds, parse_sizes


def _sizes(text: str | None, name: str) -> tuple[int, ...] | None:
    return None if text is None else tuple(parse_sizes(text, f"--{name}"))


def _seeds(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else tuple(parse_seeds(text, "--seeds"))


def _lrs(text: str | None) -> tuple[float, ...] | None:
    return None if text is None else tuple(parse_floats(text, "--lr", positive=True))


def _one_lr(text: str | None) -> float | None:
    values = _lrs(text)
    if values is not None and len(values) != 1:
        raise AuditError(f"--lr takes one number here, got {text!r}")
    return None if values is None else values[0]


def _override(base: dict[str, Any], **values: Any) -> dict[str, Any]:
    return {**base, **{k: v for k, v in values.items() if v is not None}}


_common = [
    click.option("--scale", default="reference", show_default=True, help="reference (CPU minutes) or paper (full)."),
    click.option("--seeds", default=None, help="Comma-separated seeds (overrides the scale)."),
    click.option("--steps", type=int, default=None, help="Max training steps per model (overrides the scale)."),
    click.option("--lr", default=None,
                 help="Learning rate (overrides the scale); recall scaling/tradeoff take a comma-separated list "
                      "and keep each model's best run."),
    click.option("--out", type=click.Path(file_okay=False), default=None, help="Output folder [runs/<name>-<time>]."),
    click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
                 help="Run sweep units here or as Ray tasks."),
    threads_option,
    click.option("--no-plots", is_flag=True, help="Skip the PNG figures."),
]


def _with_common(fn):
    for option in reversed(_common):
        fn = option(fn)
    return fn


@click.command("assoc")
@click.option("--memory", type=click.Choice(["linear", "mlp", "both"]), default="both", show_default=True,
              help="Which associative memory to measure.")
@click.option("--dims", default=None, help="Comma-separated embedding dimensions d (overrides the scale).")
@click.option("--width-ratios", default=None, help="Comma-separated MLP widths m/d (MLP only).")
@click.option("--rel-tol", type=float, default=None, help="Stop the bisection at this relative bracket (0 = exact).")
@_with_common
def assoc_command(memory, dims, width_ratios, rel_tol, scale, seeds, steps, lr, out, executor, no_plots):
    """Capacity of linear and MLP associative memories: the largest N stored at 99% accuracy over all
    N items (bisection), swept over d (and m/d), with scaling-law fits against d^2 = 1.3 N ln N and
    m d = 0.35 N ln N.

    \b
    audit assoc --out runs/assoc                 # reference scale, both memories (~3 CPU minutes)
    audit assoc --memory linear --dims 8,16,32   # a custom sweep
    audit assoc --scale paper                    # the paper's sizes, steps and seeds
    """
    check_executor(executor)
    kinds = ["linear", "mlp"] if memory == "both" else [memory]
    configs = [
        AssocConfig(kind=kind, **_override(presets.preset(presets.ASSOC[kind], scale), dims=_sizes(dims, "dims"),
                                           width_ratios=_sizes(width_ratios, "width-ratios"), seeds=_seeds(seeds),
                                           steps=steps, lr=_one_lr(lr), rel_tol=rel_tol))
        for kind in kinds
    ]
    folder = default_out(out, "assoc")
    with output_folder(folder):
        frames = []
        for config in configs:
            click.echo(f"{config.kind} memory: d in {config.dims}, seeds {config.seeds}, <= {config.steps} steps "
                       f"-> {folder / config.kind}")
            frames.append(run_assoc(config, folder / config.kind, executor=executor))
        rows = pd.concat(frames, ignore_index=True)
        write_csv_atomic(rows, folder / "capacity.csv")
        text = summary.capacity_markdown(rows)
        (folder / "summary.md").write_text(text + "\n")
        if not no_plots:
            plots.plot_capacity(rows, folder / "capacity.png")
    click.echo(text)
    click.echo(f"wrote {folder / 'capacity.csv'}, {folder / 'summary.md'}" + ("" if no_plots else f", {folder / 'capacity.png'}"))


@click.group("recall")
def recall_command():
    """Factual recall with one-layer transformers: facts stored per parameter (``scaling``), the
    attention-versus-MLP heat map (``tradeoff``), the learning stages (``dynamics``), or ``all``.

    \b
    audit recall all --out runs/recall          # the three at reference scale
    audit recall dynamics --seeds 0             # the paper's dynamics setting, one seed
    """


def _training(settings: dict[str, Any], steps, lr) -> dict[str, Any]:
    training = _override(settings.pop("training"), steps=steps, lrs=_lrs(lr))
    settings["training"] = RecallTraining(**training)
    return settings


def _scaling_config(scale: str, seeds, steps, lr, dims) -> ScalingConfig:
    settings = _override(presets.preset(presets.RECALL_SCALING, scale), dims=_sizes(dims, "dims"), seeds=_seeds(seeds))
    return ScalingConfig(**_training(settings, steps, lr))


def _tradeoff_config(scale: str, seeds, steps, lr) -> TradeoffConfig:
    settings = _override(presets.preset(presets.RECALL_TRADEOFF, scale), seeds=_seeds(seeds))
    return TradeoffConfig(**_training(settings, steps, lr))


def _dynamics_config(scale: str, seeds, steps, lr) -> DynamicsConfig:
    settings = _override(presets.preset(presets.RECALL_DYNAMICS, scale), seeds=_seeds(seeds), steps=steps,
                         lr=_one_lr(lr))
    return DynamicsConfig(**settings)


def _scaling(config: ScalingConfig, folder: Path, executor: str, no_plots: bool) -> str:
    click.echo(f"recall scaling: d in {config.dims}, m/d in {config.width_ratios}, seeds {config.seeds} -> {folder}")
    rows = run_scaling(config, folder / "scaling", executor=executor)
    write_csv_atomic(rows, folder / "facts.csv")
    if not no_plots:
        plots.plot_facts(rows, folder / "facts.png")
    return "## Facts against parameters\n\n" + summary.facts_markdown(rows)


def _tradeoff(config: TradeoffConfig, folder: Path, executor: str, no_plots: bool) -> str:
    click.echo(f"recall trade-off: H in {config.heads}, m in {config.widths}, S=R={config.subjects} -> {folder}")
    rows = run_tradeoff(config, folder / "tradeoff", executor=executor)
    write_csv_atomic(rows, folder / "tradeoff.csv")
    if not no_plots:
        plots.plot_tradeoff(rows, folder / "tradeoff.png")
    return "## Attention versus MLP\n\n" + summary.tradeoff_markdown(rows)


def _dynamics(config: DynamicsConfig, folder: Path, no_plots: bool) -> str:
    click.echo(f"recall dynamics: S={config.subjects}, R={config.relations}, D={config.answers_per_relation}, "
               f"{config.steps} steps, seeds {config.seeds} -> {folder}")
    curves, stages = run_dynamics(config)
    write_csv_atomic(curves, folder / "dynamics_curves.csv")
    write_csv_atomic(stages, folder / "dynamics_stages.csv")
    if not no_plots:
        plots.plot_dynamics(curves, stages, folder / "dynamics.png")
    return "## Learning stages\n\n" + summary.dynamics_markdown(stages)


def _finish(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.md").write_text(text + "\n")
    click.echo(text)
    click.echo(f"wrote {folder}")


@recall_command.command("scaling")
@click.option("--dims", default=None, help="Comma-separated model widths d (overrides the scale).")
@_with_common
def scaling_command(dims, scale, seeds, steps, lr, out, executor, no_plots):
    """Facts stored (the largest S x R table at 99% over all facts; bisection on S + R) against
    parameters, with the fitted facts per parameter and bits per parameter."""
    check_executor(executor)
    config = _scaling_config(scale, seeds, steps, lr, dims)
    folder = default_out(out, "recall")
    with output_folder(folder):
        _finish(folder, "scaling", _scaling(config, folder, executor, no_plots))


@recall_command.command("tradeoff")
@_with_common
def tradeoff_command(scale, seeds, steps, lr, out, executor, no_plots):
    """Accuracy over a grid of heads H and MLP widths m at S = R = 32, d = 32, d_h = 8."""
    check_executor(executor)
    config = _tradeoff_config(scale, seeds, steps, lr)
    folder = default_out(out, "recall")
    with output_folder(folder):
        _finish(folder, "tradeoff", _tradeoff(config, folder, executor, no_plots))


@recall_command.command("dynamics")
@_with_common
def dynamics_command(scale, seeds, steps, lr, out, executor, no_plots):
    """Linear attention on one-hot embeddings: loss curves and the detected stages (step numbers)."""
    check_executor(executor)
    config = _dynamics_config(scale, seeds, steps, lr)
    folder = default_out(out, "recall")
    with output_folder(folder):
        _finish(folder, "dynamics", _dynamics(config, folder, no_plots))


@recall_command.command("all")
@_with_common
def all_command(scale, seeds, steps, lr, out, executor, no_plots):
    """Scaling, trade-off and dynamics into one folder (``summary.md`` holds the three summaries).

    --steps and --lr apply to scaling and trade-off; dynamics keeps the paper's 8192 steps of GD at 0.1.
    """
    check_executor(executor)
    scaling = _scaling_config(scale, seeds, steps, lr, None)
    tradeoff = _tradeoff_config(scale, seeds, steps, lr)
    dynamics = _dynamics_config(scale, seeds, None, None)  # its own steps and plain-GD lr (the paper's)
    folder = default_out(out, "recall")
    with output_folder(folder):
        parts = [
            _scaling(scaling, folder, executor, no_plots),
            _tradeoff(tradeoff, folder, executor, no_plots),
            _dynamics(dynamics, folder, no_plots),
        ]
        settings = {"scale": scale, "seeds": seeds, "steps": steps, "lr": lr}
        (folder / "settings.json").write_text(json.dumps(settings) + "\n")
        _finish(folder, "summary", "\n\n".join(parts))
