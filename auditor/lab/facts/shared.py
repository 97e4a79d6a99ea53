"""What the experiments of the facts room share: the default training, the unit helpers (a unit's layers,
its stamp, its CSV database, one member's layer-tensor columns, a database through every measure), the
option groups of their configs, the column groups of their tables and the one way to declare a facts
experiment (:func:`facts_experiment`). Each experiment lives in its own module (``width``, ``budget``,
``tau``, ``bound``, ``measure``, ``scale``, ``rank``, ``train``).

A unit trains one batched ensemble (every layer shape of the unit at once, through the lab engine) or
measures databases, and returns one row per member (per member and tau, per database); every row
carries the experiment, the database spec, dtype and torch threads, and the sweep runner adds the
provenance. Certified bounds on the rank of D are ``bounds_*``, quantities of the layer tensor L
``layer_*``, CP estimates ``cp_*``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from auditor.core.errors import AuditError
from auditor.lab.engine import TrainConfig
from auditor.lab.experiment import Experiment, option
from auditor.lab.facts import plots
from auditor.lab.facts.cp import CPConfig, estimate_cp_rank
from auditor.lab.facts.database import DatabaseSpec, load_csv
from auditor.lab.facts.effective import effective_rank
from auditor.lab.facts.exact import exact_rank
from auditor.lab.facts.layer_tensor import bound_decomposition, flattening_lower_bound, layer_tensor
from auditor.lab.facts.model import FactLayer, LayerConfig
from auditor.lab.facts.tensor import rank_bounds, reconstruct
from auditor.lab.facts.training import TAUS, train_layers
from auditor.lab.sweep import file_fingerprint

TRAIN = {"steps": 2000, "lr": 3e-3, "optimizer": "adam", "eval_every": 50}  # full batch: 2000 epochs
EXACT_CORE_LIMIT = 4096  # exact-rank attempts (pencil) only on compressed cores up to this many entries
REFERENCE_DB = DatabaseSpec(kind="random", keys=32, queries=8, values_per_query=4)  # 256 triples, rank 32
QUICK_DB = DatabaseSpec(kind="random", keys=8, queries=4, values_per_query=2)
QUICK = {"steps": 60, "eval_every": 20}  # the training of every --scale quick


def train_config(config: dict[str, Any]) -> TrainConfig:
    return TrainConfig(**{**TRAIN, **config.get("train", {})})


def members_of(config: dict[str, Any]) -> list[LayerConfig]:
    return [LayerConfig(**m) for m in config["members"]]


def stamp(rows: list[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """Add what the unit ran to every row: experiment, database spec, dtype, torch threads, training."""
    db_spec = config.get("db", {"csv": config["database"]} if "database" in config else {})
    extra = {"experiment": config["experiment"], "db_spec": db_spec, "dtype": "float32",
             "torch_threads": torch.get_num_threads()}
    if "members" in config:  # the unit trained layers
        extra["train_config"] = train_config(config).to_dict()
    return [{**row, **extra} for row in rows]


def train_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train every member of the unit on its database; one row per member (width, budget)."""
    db = DatabaseSpec(**config["db"]).build()
    bounds = rank_bounds(db)
    trained = train_layers(db, members_of(config), train_config(config), batch_size=config.get("batch_size"))
    rows = [{**row, "bounds_lower": bounds.lower, "bounds_upper": bounds.upper, "bounds_exact": bounds.exact,
             "on_budget": row["d_qk"] + row["d_vo"] == row["d_model"] + 1} for row in trained.rows]
    return stamp(rows, config)


def layer_columns(model: FactLayer, member: int, cp: CPConfig) -> dict[str, Any]:
    """The bound on rank(L) of one member with its explicit construction checked, L's flattening lower
    bound and its CP estimate (capped by the bound, certified when the construction reproduces L)."""
    lt = layer_tensor(model, member)
    L = lt.full()
    bound, factors = bound_decomposition(lt)
    residual = float(np.linalg.norm(reconstruct(factors) - L) / np.linalg.norm(L))
    est = estimate_cp_rank(L, cp, ceiling=bound.bound, ceiling_certified=residual <= 1e-8)
    return {**{f"layer_{k}": v for k, v in bound.to_row().items()}, "construction_residual": residual,
            "layer_flattening_lower": flattening_lower_bound(L), "layer_cp_rank": est.rank,
            "layer_cp_reached_by": est.reached_by, "layer_cp_seconds": est.seconds}


def measure_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """One database through every measure, each timed: the certified bounds, the exact rank when the
    bounds leave it open on a small core, the CP estimate and (optionally) the effective rank."""
    t0 = time.perf_counter()
    spec = DatabaseSpec(**config["db"])
    db = spec.build()
    row: dict[str, Any] = {**db.summary(), "seed": spec.seed, "build_seconds": time.perf_counter() - t0}
    t0 = time.perf_counter()
    bounds = rank_bounds(db)
    row.update(
        {f"bounds_{k}": v for k, v in bounds.to_row().items()}, bounds_seconds=time.perf_counter() - t0
    )
    exact, method = bounds.exact, "bounds meet" if bounds.exact is not None else "open"
    if exact is None and np.prod(bounds.core_shape) <= EXACT_CORE_LIMIT:
        result = exact_rank(db)
        exact, method = result.rank, result.method
    row.update(exact_rank=exact, exact_method=method)
    row.update(
        {f"cp_{k}": v for k, v in estimate_cp_rank(db, CPConfig(**config.get("cp", {}))).to_row().items()}
    )
    if config.get("effective", True):
        row.update(effective_rank(db, restarts=config.get("effective_restarts", 2),
                                  max_rank=config.get("effective_max")).to_row())
    return stamp([row], config)


def csv_database(config: dict[str, Any]):
    return load_csv(config["database"], **config["columns"])


@dataclass(frozen=True)
class Training:
    """Training options of the facts sweeps; only the ones set enter a unit (None: the experiment's own)."""

    steps: int | None = option(None, "Training steps.", default_help="2000")
    lr: float | None = option(
        None, "Peak Adam learning rate.", parse="floats", default_help="3e-3; scale 1e-2"
    )
    eval_every: int | None = None

    def __post_init__(self) -> None:
        TrainConfig(**{**TRAIN, **self.train()})  # checked before any folder exists

    def train(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("steps", "lr", "eval_every") if getattr(self, k) is not None}


@dataclass(frozen=True)
class Seeded(Training):
    db_seeds: tuple[int, ...] = option((0, 1), "Database seeds.")
    seeds: tuple[int, ...] = option((0, 1, 2), "Initialisation seeds of the layers.")

    def _units(
        self, name: str, db: DatabaseSpec, members: list[LayerConfig], **extra: Any
    ) -> list[dict[str, Any]]:
        layers = [m.to_dict() for m in members]
        return [{"experiment": name, "db": {**db.to_dict(), "seed": s}, "members": layers, **extra,
                 "train": self.train()} for s in self.db_seeds]


@dataclass(frozen=True)
class CSVDatabase:
    """A database CSV and its columns."""

    database: str | None = option(None, "Database CSV with a header row.", argument=True)
    key_col: str = option("key", "CSV column of the key.")
    query_col: str = option("query", "CSV column of the query.")
    value_col: str = option("value", "CSV column of the value.")

    def __post_init__(self) -> None:
        if self.database is None:
            raise AuditError("give a DATABASE csv (e.g. written by `audit facts generate`)")
        load_csv(
            self.database, **self.columns()
        )  # a missing file, an unknown column or a clash: here, not later

    def columns(self) -> dict[str, str]:
        return {"key": self.key_col, "query": self.query_col, "value": self.value_col}

    def unit(self, experiment: str, **extra: Any) -> list[dict[str, Any]]:
        return [{"experiment": experiment, "database": str(Path(self.database).resolve()),
                 "fingerprint": file_fingerprint(self.database), "columns": self.columns(), **extra}]


IDS = ("db", "triples", "keys", "queries", "values", "density")
LAYER = ("d_model", "heads", "d_qk", "d_vo", "seed")
TRAINED = ("parameters", "accuracy", "facts_stored", *(f"acc_tau{t:g}" for t in TAUS), "steps_trained",
            "early_stopped", "train_seconds", "bucket_members")
STAMP = ("experiment", "db_spec", "dtype", "torch_threads", "train_config")
BOUND_PARTS = ("bound", "joint", "key_side", "query_side", "slice_bound", "construction", "direct_rank",
                "attention_ranks", "value_ranks")
LAYER_BOUND = (*(f"layer_{k}" for k in BOUND_PARTS), "construction_residual", "layer_flattening_lower",
                "layer_cp_rank", "layer_cp_reached_by", "layer_cp_seconds")
BOUNDS = tuple(f"bounds_{k}" for k in ("lower", "upper", "paper_bound", "value_slice_bound", "flattening",
                                        "core_shape", "exact"))
CP = tuple(
    f"cp_{k}"
    for k in (
        "rank",
        "floor",
        "ceiling",
        "ceiling_certified",
        "reached_by",
        "tolerance",
        "backend",
        "shape",
        "seconds",
        "tried",
    )
)
EFFECTIVE = ("effective_rank", "effective_lower", "effective_exact", "effective_seconds", "effective_tried")
MEASURED = (*IDS, "seed", "build_seconds", *BOUNDS, "bounds_seconds", "exact_rank", "exact_method", *CP,
             *EFFECTIVE)
KEY_DEFAULTS = {
    "db": DatabaseSpec,
    "members": [LayerConfig],
    "cp": CPConfig,
}  # a unit's key leaves these defaults out
SHOW_TRAINED = (
    "d_model",
    "heads",
    "d_qk",
    "d_vo",
    "seed",
    "parameters",
    "accuracy",
    "acc_tau0.95",
    "steps_trained",
    "layer_bound",
    "layer_cp_rank",
    "layer_flattening_lower",
)


GRID_COLUMNS = (*IDS, *LAYER, *TRAINED, "bounds_lower", "bounds_upper", "bounds_exact", "on_budget", *STAMP)


def facts_experiment(name: str, help: str, config: type,
                     run_unit: Callable[[dict[str, Any]], list[dict[str, Any]]], columns: tuple[str, ...],
                     **kwargs: Any) -> Experiment:
    """A facts experiment: its config splits into units, each run by ``run_unit`` through the shared
    runner."""
    draw = plots.PLOTS.get(name)
    return Experiment(name=f"facts {name}", help=help, config=config, units=lambda c, out: c.units(),
                      run_unit=run_unit, columns=tuple(dict.fromkeys(columns)),
                      plots=(lambda frame, out, c: draw(frame, out)) if draw else None,
                      key_defaults=KEY_DEFAULTS, **kwargs)


SEEDED = {"show": SHOW_TRAINED}
