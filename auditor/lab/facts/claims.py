"""Paper B's two claims about argmax and softmax>=tau, as tables computed from finished runs.

* :func:`argmax_inflation`: do layers whose rank bound lies far below rank(D) still store D under
  argmax? (The paper: "rank-10 layers fit rank-80 databases".) One row per layer shape.
* :func:`tau_tracking`: which tau makes the rank of softmax>=tau(L) follow the rank a layer can hold,
  min(bound on rank(L), rank(D))? (The paper: tau = 0.95 matches rank best.) One row per tau.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from auditor.core.atomic import real_folder, write_csv_atomic
from auditor.core.errors import AuditError


def _need(frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame]
    if missing:
        raise AuditError(
            f"{what} needs the columns {', '.join(missing)}; "
            f"run `audit facts {'train --layer-rank' if 'layer_bound' in missing else 'tau'}` first"
        )


def argmax_inflation(frame: pd.DataFrame, rank: int) -> pd.DataFrame:
    """Per layer shape (d_model, heads, d_qk, d_vo) and learning rate: the bound on rank(L), the best and
    mean argmax accuracy over seeds, how many seeds stored every fact, and the most facts stored, next
    to ``rank`` = rank(D). ``frame``: rows of ``audit facts train --layer-rank`` (several runs may be
    concatenated; ``lr`` is read from ``train_config``)."""
    _need(
        frame,
        ("d_model", "heads", "d_qk", "d_vo", "accuracy", "layer_bound", "facts_stored", "train_config"),
        "argmax_inflation",
    )
    lr = frame["train_config"].map(lambda c: (c if isinstance(c, dict) else json.loads(c))["lr"])
    table = (frame.assign(lr=lr).groupby(["d_model", "heads", "d_qk", "d_vo", "lr"])
             .agg(layer_bound=("layer_bound", "max"), accuracy_mean=("accuracy", "mean"),
                  accuracy_best=("accuracy", "max"), facts_stored_best=("facts_stored", "max"),
                  all_facts=("accuracy", lambda a: f"{int((a >= 1).sum())}/{len(a)}"))
             .reset_index())
    table["rank_D"] = rank
    return table


def tau_tracking(frame: pd.DataFrame, rank: int | None = None) -> pd.DataFrame:
    """Per tau, over every trained layer of an ``audit facts tau`` run: the mean relative gap
    |rank(softmax>=tau(L)) - min(bound on rank(L), rank(D))| / rank(D) (``gap``, lower tracks better),
    the share of layers whose thresholded rank exceeds their bound (``inflated``), and the mean
    softmax>=tau accuracy. ``rank`` = rank(D) (default: the run's CP estimate of D)."""
    _need(frame, ("tau", "s_cp_rank", "layer_bound", "acc_tau", "cp_rank"), "tau_tracking")
    rank = int(frame["cp_rank"].iloc[0]) if rank is None else rank
    holdable = frame["layer_bound"].clip(upper=rank)
    rows = frame.assign(
        gap=(frame["s_cp_rank"] - holdable).abs() / rank, inflated=frame["s_cp_rank"] > frame["layer_bound"]
    )
    table = (
        rows.groupby("tau")
        .agg(
            gap=("gap", "mean"),
            inflated=("inflated", "mean"),
            accuracy=("acc_tau", "mean"),
            layers=("gap", "size"),
        )
        .reset_index()
    )
    table["best"] = table["gap"] == table["gap"].min()
    return table


def write_claims(argmax_runs: list[str | Path], tau_runs: list[str | Path], out: str | Path, *,
                 rank: int) -> list[Path]:
    """Tables and figures of both claims from finished run folders (each holding ``results.csv``):
    ``argmax.csv`` + ``argmax.png`` from ``audit facts train --layer-rank`` runs, ``tau_tracking.csv`` +
    ``tau_tracking.png`` (one row per run and tau; the figure averages the runs) from ``audit facts tau``
    runs. ``rank``: rank(D) of the argmax runs' database (the tau runs carry their own)."""
    from auditor.lab.facts.plots import plot_argmax, plot_tau_tracking

    out = Path(out)
    real_folder(out)
    paths = []
    if argmax_runs:
        table = argmax_inflation(pd.concat([pd.read_csv(Path(r) / "results.csv") for r in argmax_runs]), rank)
        write_csv_atomic(table, out / "argmax.csv")
        paths += [out / "argmax.csv", *plot_argmax(table, out)]
    if tau_runs:
        tables = []
        for run in tau_runs:
            frame = pd.read_csv(Path(run) / "results.csv")
            lr = json.loads(frame["train_config"].iloc[0])["lr"]
            tables.append(tau_tracking(frame).assign(lr=lr, run=Path(run).name))
        table = pd.concat(tables, ignore_index=True)
        write_csv_atomic(table, out / "tau_tracking.csv")
        mean = table.groupby("tau")[["gap", "inflated", "accuracy"]].mean().reset_index()
        paths += [out / "tau_tracking.csv", *plot_tau_tracking(mean, out)]
    return paths
