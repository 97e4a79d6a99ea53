"""``audit assoc`` (associative-memory capacity) and ``audit recall`` (factual recall) commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pandas as pd
import torch

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
from auditor.lab.sweep import EXECUTORS
from auditor.provenance import timestamp


def _ints(text: str | None, name: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise AuditError(f"--{name} takes comma-separated integers (e.g. 8,16,32), got {text!r}") from None
    if not values:
        raise AuditError(f"--{name} is empty; give comma-separated integers (e.g. 8,16,32)")
    return values


def _floats(text: str | None, name: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise AuditError(f"--{name} takes comma-separated numbers (e.g. 0,1), got {text!r}") from None
    if not values:
        raise AuditError(f"--{name} is empty; give comma-separated numbers (e.g. 0,1)")
    return values


def _one_float(text: str | None, name: str) -> float | None:
    values = _floats(text, name)
    if values is not None and len(values) != 1:
        raise AuditError(f"--{name} takes one number here, got {text!r}")
    return None if values is None else values[0]


def _override(base: dict[str, Any], **values: Any) -> dict[str, Any]:
    return {**base, **{k: v for k, v in values.items() if v is not None}}


def _setup(out: str | None, name: str, threads: int) -> Path:
    if threads < 1:
        raise AuditError(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    path = Path(out) if out else Path("runs") / f"{name}-{timestamp()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    click.option("--threads", type=int, default=1, show_default=True,
                 help="Torch threads; these small models run fastest on one thread per process."),
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
def assoc_command(memory, dims, width_ratios, rel_tol, scale, seeds, steps, lr, out, executor, threads, no_plots):
    """Capacity of linear and MLP associative memories: the largest N stored at 99% accuracy over all
    N items (bisection), swept over d (and m/d), with scaling-law fits against d^2 = 1.3 N ln N and
    m d = 0.35 N ln N.

    \b
    audit assoc --out runs/assoc                 # reference scale, both memories (~3 CPU minutes)
    audit assoc --memory linear --dims 8,16,32   # a custom sweep
    audit assoc --scale paper                    # the paper's sizes, steps and seeds
    """
    folder = _setup(out, "assoc", threads)
    kinds = ["linear", "mlp"] if memory == "both" else [memory]
    frames = []
    for kind in kinds:
        settings = _override(presets.preset(presets.ASSOC[kind], scale), dims=_ints(dims, "dims"),
                             width_ratios=_ints(width_ratios, "width-ratios"), seeds=_ints(seeds, "seeds"),
                             steps=steps, lr=_one_float(lr, "lr"), rel_tol=rel_tol)
        config = AssocConfig(kind=kind, **settings)
        click.echo(f"{kind} memory: d in {config.dims}, seeds {config.seeds}, <= {config.steps} steps -> {folder / kind}")
        frames.append(run_assoc(config, folder / kind, executor=executor))
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
    """Factual recall with one-layer transformers (SPEC 3): facts per parameter (``scaling``), the
    attention-versus-MLP heat map (``tradeoff``), the learning stages (``dynamics``), or ``all``.

    \b
    audit recall all --out runs/recall          # the three at reference scale
    audit recall dynamics --seeds 0             # the paper's dynamics setting, one seed
    """


def _training(settings: dict[str, Any], steps, lr) -> dict[str, Any]:
    training = _override(settings.pop("training"), steps=steps, lrs=_floats(lr, "lr"))
    settings["training"] = RecallTraining(**training)
    return settings


def _scaling(folder: Path, scale: str, seeds, steps, lr, dims, executor: str, no_plots: bool) -> str:
    settings = _override(presets.preset(presets.RECALL_SCALING, scale), dims=_ints(dims, "dims"), seeds=_ints(seeds, "seeds"))
    config = ScalingConfig(**_training(settings, steps, lr))
    click.echo(f"recall scaling: d in {config.dims}, m/d in {config.width_ratios}, seeds {config.seeds} -> {folder}")
    rows = run_scaling(config, folder / "scaling", executor=executor)
    write_csv_atomic(rows, folder / "facts.csv")
    if not no_plots:
        plots.plot_facts(rows, folder / "facts.png")
    return "## Facts against parameters\n\n" + summary.facts_markdown(rows)


def _tradeoff(folder: Path, scale: str, seeds, steps, lr, executor: str, no_plots: bool) -> str:
    settings = _override(presets.preset(presets.RECALL_TRADEOFF, scale), seeds=_ints(seeds, "seeds"))
    config = TradeoffConfig(**_training(settings, steps, lr))
    click.echo(f"recall trade-off: H in {config.heads}, m in {config.widths}, S=R={config.subjects} -> {folder}")
    rows = run_tradeoff(config, folder / "tradeoff", executor=executor)
    write_csv_atomic(rows, folder / "tradeoff.csv")
    if not no_plots:
        plots.plot_tradeoff(rows, folder / "tradeoff.png")
    return "## Attention versus MLP\n\n" + summary.tradeoff_markdown(rows)


def _dynamics(folder: Path, scale: str, seeds, steps, lr, no_plots: bool) -> str:
    settings = _override(presets.preset(presets.RECALL_DYNAMICS, scale), seeds=_ints(seeds, "seeds"), steps=steps,
                         lr=_one_float(lr, "lr"))
    config = DynamicsConfig(**settings)
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
def scaling_command(dims, scale, seeds, steps, lr, out, executor, threads, no_plots):
    """Facts stored (the largest S x R table at 99% over all facts; bisection on S + R) against
    parameters, with the fitted facts per parameter and bits per parameter."""
    folder = _setup(out, "recall", threads)
    _finish(folder, "scaling", _scaling(folder, scale, seeds, steps, lr, dims, executor, no_plots))


@recall_command.command("tradeoff")
@_with_common
def tradeoff_command(scale, seeds, steps, lr, out, executor, threads, no_plots):
    """Accuracy over a grid of heads H and MLP widths m at S = R = 32, d = 32, d_h = 8."""
    folder = _setup(out, "recall", threads)
    _finish(folder, "tradeoff", _tradeoff(folder, scale, seeds, steps, lr, executor, no_plots))


@recall_command.command("dynamics")
@_with_common
def dynamics_command(scale, seeds, steps, lr, out, executor, threads, no_plots):
    """Linear attention on one-hot embeddings: loss curves and the detected stages (step numbers)."""
    folder = _setup(out, "recall", threads)
    _finish(folder, "dynamics", _dynamics(folder, scale, seeds, steps, lr, no_plots))


@recall_command.command("all")
@_with_common
def all_command(scale, seeds, steps, lr, out, executor, threads, no_plots):
    """Scaling, trade-off and dynamics into one folder (``summary.md`` holds the three summaries).

    --steps and --lr apply to scaling and trade-off; dynamics keeps the paper's 8192 steps of GD at 0.1.
    """
    folder = _setup(out, "recall", threads)
    parts = [
        _scaling(folder, scale, seeds, steps, lr, None, executor, no_plots),
        _tradeoff(folder, scale, seeds, steps, lr, executor, no_plots),
        _dynamics(folder, scale, seeds, None, None, no_plots),  # its own steps and plain-GD lr (the paper's)
    ]
    (folder / "settings.json").write_text(json.dumps({"scale": scale, "seeds": seeds, "steps": steps, "lr": lr}) + "\n")
    _finish(folder, "summary", "\n\n".join(parts))
