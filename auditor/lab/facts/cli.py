"""``audit facts``: fact databases as tensors and the capacity of one attention-only layer.

\b
  audit facts generate --keys 32 --queries 8 --values-per-query 4 -o db.csv
  audit facts rank db.csv [--effective]          # bounds, exact rank (tiny), CP estimate
  audit facts train db.csv --d-model 8 --d-vo 1:8 [--layer-rank]
  audit facts sweep width|budget|tau|bound|measure|scale [--quick] --out DIR
  audit facts plot DIR

Lists are comma separated (``--d-vo 1,2,4``) or inclusive ranges (``--d-vo 1:8``). Sweeps resume when
rerun with the same ``--out``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pandas as pd

from auditor.errors import AuditError
from auditor.lab.cli import SEED, SIZE, default_out, output_folder, threads_option
from auditor.lab.sweep import check_executor
from auditor.options import parse_seeds, parse_sizes
from auditor.provenance import provenance


def _out(out: str | None, name: str) -> Path:
    return default_out(out, f"facts-{name}")


def _show(frame: pd.DataFrame, columns: list[str]) -> None:
    present = [c for c in columns if c in frame]
    click.echo(frame[present].to_markdown(index=False, floatfmt=".4g"))


def _load(path: str, key: str, query: str, value: str):
    from auditor.lab.facts.database import load_csv

    return load_csv(path, key=key, query=query, value=value)


def column_options(f):
    """--key-col/--query-col/--value-col for commands that read a database CSV."""
    for name, default in (("value", "value"), ("query", "query"), ("key", "key")):
        f = click.option(
            f"--{name}-col", default=default, show_default=True, help=f"CSV column of the {name}."
        )(f)
    return f


@click.group("facts", context_settings={"help_option_names": ["-h", "--help"]})
def facts_command() -> None:
    """Fact databases as tensors (rank, bounds) and how much one attention-only layer memorizes."""


@facts_command.command("generate")
@click.option("--kind", type=click.Choice(["random", "planted"]), default="random", show_default=True)
@click.option("--keys", default=32, type=SIZE, show_default=True, help="|K|.")
@click.option("--queries", default=8, type=SIZE, show_default=True, help="|Q| (relations).")
@click.option(
    "--values-per-query",
    default=4,
    type=SIZE,
    show_default=True,
    help="Values each relation owns (or shared vocabulary size).",
)
@click.option("--shared-values", is_flag=True, help="One value vocabulary shared by every relation.")
@click.option("--density", default=1.0, show_default=True, help="Fraction of (key, query) pairs present.")
@click.option("--key-groups", default=4, type=SIZE, show_default=True, help="planted: key groups.")
@click.option("--query-groups", default=2, type=SIZE, show_default=True, help="planted: query groups.")
@click.option("--noise", default=0.0, show_default=True, help="planted: fraction of facts relabelled.")
@click.option("--seed", default=0, type=SEED, show_default=True)
@click.option("-o", "--output", required=True, help="CSV file to write (columns key, query, value).")
@threads_option
def generate_command(output: str, **spec: Any) -> None:
    """Write a seeded random database as CSV."""
    from auditor.lab.facts.database import DatabaseSpec

    db = DatabaseSpec(**spec).build()
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    db.save_csv(output)
    click.echo(f"{db.name}: {db.num_triples} triples, shape {db.shape} -> {output}")


@facts_command.command("rank")
@click.argument("database", type=click.Path(dir_okay=False))
@column_options
@click.option("--tol", default=1e-4, show_default=True, help="Relative error at which a CP rank fits.")
@click.option("--restarts", default=4, show_default=True, help="Random restarts per rank.")
@click.option("--max-iter", default=3000, show_default=True, help="ALS sweeps per fit.")
@click.option("--backend", type=click.Choice(["auto", "tensorly", "als"]), default="auto", show_default=True)
@click.option("--effective", is_flag=True, help="Also search the effective (argmax) rank (trains CP logits).")
@threads_option
@click.option("--out", default=None, help="Write the row as CSV here.")
def rank_command(
    database: str,
    key_col: str,
    query_col: str,
    value_col: str,
    tol: float,
    restarts: int,
    max_iter: int,
    backend: str,
    effective: bool,
    out: str | None,
) -> None:
    """Measure a database: triples, the paper's bound, certified bounds, exact rank, CP estimate."""
    from auditor.lab.facts.cp import CPConfig, estimate_cp_rank
    from auditor.lab.facts.effective import effective_rank
    from auditor.lab.facts.exact import exact_rank
    from auditor.lab.facts.tensor import rank_bounds

    cp = CPConfig(tol=tol, restarts=restarts, max_iter=max_iter, backend=backend)
    db = _load(database, key_col, query_col, value_col)
    row: dict[str, Any] = {**db.summary(), **rank_bounds(db).to_row()}
    if max(db.shape) <= 64:
        row.update(exact_rank(db).to_row())
    row.update({f"cp_{k}": v for k, v in estimate_cp_rank(db, cp, progress=True).to_row().items()})
    if effective:
        row.update(effective_rank(db).to_row())
    row.update(provenance())
    frame = pd.DataFrame([row])
    show = [
        "db",
        "triples",
        "keys",
        "queries",
        "values",
        "paper_bound",
        "value_slice_bound",
        "lower",
        "upper",
        "exact_rank",
        "exact_method",
        "cp_rank",
        "cp_reached_by",
        "cp_tol",
        "effective_rank",
    ]
    _show(frame, show)
    if out:
        from auditor.atomic import write_csv_atomic

        write_csv_atomic(frame, Path(out))


@facts_command.command("train")
@click.argument("database", type=click.Path(dir_okay=False))
@column_options
@click.option("--d-model", default="8", show_default=True, help="Widths (list or range).")
@click.option("--heads", default="1", show_default=True, help="Head counts (list or range).")
@click.option("--d-qk", default=None, help="d_head,qk values (default: d_model).")
@click.option("--d-vo", default=None, help="d_head,vo values (default: d_model).")
@click.option(
    "--budget", is_flag=True, help="Pair each d_vo with d_qk = d_model - d_vo + 1 instead of a grid."
)
@click.option("--seeds", default="0", show_default=True, help="Initialisation seeds.")
@click.option("--steps", default=2000, show_default=True)
@click.option("--lr", default=3e-3, show_default=True)
@click.option("--batch-size", default=None, type=int, help="Triples per step (default: full batch).")
@click.option("--layer-rank", is_flag=True, help="Also compute the layer tensor L's bound and CP estimate.")
@threads_option
@click.option("--out", default=None, help="Output folder (default runs/facts-train-<time>).")
def train_command(
    database: str,
    key_col: str,
    query_col: str,
    value_col: str,
    d_model: str,
    heads: str,
    d_qk: str | None,
    d_vo: str | None,
    budget: bool,
    seeds: str,
    steps: int,
    lr: float,
    batch_size: int | None,
    layer_rank: bool,
    out: str | None,
) -> None:
    """Train one attention-only layer per configuration (all batched) and report the accuracies."""
    from auditor.atomic import write_csv_atomic
    from auditor.lab.engine import TrainConfig
    from auditor.lab.facts.model import LayerConfig
    from auditor.lab.facts.training import train_layers

    widths, head_counts = parse_sizes(d_model, "--d-model"), parse_sizes(heads, "--heads")
    vo_list = parse_sizes(d_vo, "--d-vo") if d_vo else None
    qk_list = parse_sizes(d_qk, "--d-qk") if d_qk else None
    seed_list = parse_seeds(seeds, "--seeds")
    if budget and vo_list and max(vo_list) > min(widths):
        raise AuditError("--budget needs every d_vo <= d_model (so that d_qk = d_model - d_vo + 1 >= 1)")
    if batch_size is not None and batch_size < 1:
        raise AuditError(f"--batch-size must be >= 1, got {batch_size}")
    train_cfg = TrainConfig(steps=steps, lr=lr, eval_every=50)
    configs = []
    for d in widths:
        for h in head_counts:
            for vo in vo_list or [d]:
                for qk in [d - vo + 1] if budget else (qk_list or [d]):
                    for s in seed_list:
                        configs.append(LayerConfig(d_model=d, heads=h, d_qk=qk, d_vo=vo, seed=s))
    db = _load(database, key_col, query_col, value_col)
    trained = train_layers(db, configs, train_cfg, batch_size=batch_size, progress=True)
    rows = trained.rows
    if layer_rank:
        rows = [{**row, **_layer_row(trained.model, e)} for e, row in enumerate(rows)]
    extra = {
        "train_config": json.dumps(train_cfg.to_dict()),
        "dtype": "float32",
        "device": "cpu",
        **provenance(),
    }
    frame = pd.DataFrame([{**r, **extra} for r in rows])
    folder = _out(out, "train")
    write_csv_atomic(frame, folder / "results.csv")
    _show(
        frame,
        [
            "d_model",
            "heads",
            "d_qk",
            "d_vo",
            "seed",
            "params",
            "accuracy",
            "acc_tau0.95",
            "steps_trained",
            "bound",
            "cp_rank",
            "flattening_lower",
        ],
    )
    click.echo(f"wrote {folder / 'results.csv'}")


def _layer_row(model, member: int) -> dict[str, Any]:
    import numpy as np

    from auditor.lab.facts.cp import CPConfig, estimate_cp_rank
    from auditor.lab.facts.layer_tensor import bound_decomposition, flattening_lower_bound, layer_tensor
    from auditor.lab.facts.tensor import reconstruct

    lt = layer_tensor(model, member)
    L = lt.full()
    bound, factors = bound_decomposition(lt)
    residual = float(np.linalg.norm(reconstruct(factors) - L) / np.linalg.norm(L))
    est = estimate_cp_rank(
        L, CPConfig(restarts=2, max_iter=500), ceiling=bound.bound, ceiling_certified=residual <= 1e-8
    )
    return {
        **bound.to_row(),
        "construction_residual": residual,
        "cp_rank": est.rank,
        "flattening_lower": flattening_lower_bound(L),
    }


SWEEPS = ("width", "budget", "tau", "bound", "measure", "scale")


@facts_command.command("sweep")
@click.argument("experiment", type=click.Choice(SWEEPS))
@click.option(
    "--quick", is_flag=True, help="A tiny version of the experiment (smoke test, seconds to a minute)."
)
@click.option("--db-seeds", default=None, help="Database seeds (default per experiment).")
@click.option("--init-seeds", default=None, help="Initialisation seeds (default per experiment).")
@click.option("--steps", default=None, type=int, help="Training steps (default 2000).")
@click.option("--lr", default=None, type=float, help="Peak Adam learning rate (default 3e-3; scale 1e-2).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@threads_option
@click.option("--no-plot", is_flag=True, help="Skip the PNG plots.")
@click.option("--out", default=None, help="Output folder (rerun with the same folder to resume).")
def sweep_command(
    experiment: str,
    quick: bool,
    db_seeds: str | None,
    init_seeds: str | None,
    steps: int | None,
    lr: float | None,
    executor: str,
    no_plot: bool,
    out: str | None,
) -> None:
    """Run an experiment of the facts room as a resumable sweep; write results.csv and plots."""
    from auditor.lab.engine import TrainConfig
    from auditor.lab.facts.experiments import TRAIN, unit_function
    from auditor.lab.facts.plots import plot_results
    from auditor.lab.facts.presets import sweep_units
    from auditor.lab.sweep import run_sweep

    check_executor(executor)
    train = {k: v for k, v in (("steps", steps), ("lr", lr)) if v is not None}
    TrainConfig(**{**TRAIN, **train})  # --steps and --lr checked before the folder exists
    seeds = {
        "db_seeds": tuple(parse_seeds(db_seeds, "--db-seeds")) if db_seeds else None,
        "init_seeds": tuple(parse_seeds(init_seeds, "--init-seeds")) if init_seeds else None,
    }
    units = sweep_units(experiment, quick=quick, train=train, **seeds)
    folder = _out(out, experiment)
    with output_folder(folder):
        for name, configs in units.items():
            target = folder / name.removeprefix("scale-") if experiment == "scale" else folder
            frame = run_sweep(unit_function(name), configs, target, executor=executor, desc=f"facts {name}")
            click.echo(f"{name}: {len(frame)} rows -> {target / 'results.csv'}")
            if not no_plot:
                for path in plot_results(target / "results.csv"):
                    click.echo(f"plot: {path}")


@facts_command.command("plot")
@click.argument("folder", type=click.Path(exists=True))
@click.option("--out", default=None, help="Folder for the PNGs (default: next to results.csv).")
@threads_option
def plot_command(folder: str, out: str | None) -> None:
    """Redraw the plot of a finished facts sweep."""
    from auditor.lab.facts.plots import plot_results

    paths = plot_results(folder, out)
    if not paths:
        click.echo("no plot for this experiment (scale results are tables)")
    for path in paths:
        click.echo(f"plot: {path}")
