"""The experiments of the facts room (``audit facts NAME``): each a config, its units and its unit function.

A unit trains one batched ensemble (every layer shape of the unit at once, through the lab engine) or
measures databases, and returns one row per member (per member and tau, per database); every row
carries the experiment, the database spec, dtype and torch threads, and the sweep runner adds the
provenance. Certified bounds on the rank of D are ``bounds_*``, quantities of the layer tensor L
``layer_*``, CP estimates ``cp_*``.

* ``width``:  accuracy against d_model and d_vo (d_qk = d_model, H = 1), one unit per database seed.
* ``budget``: the full d_qk x d_vo grid at a fixed d_model; the anti-diagonal d_qk = d_model - d_vo + 1
  is the fixed parameter budget of Paper B (2 d_model (d_qk + d_vo) per head).
* ``tau``:    trained layers of several widths; for tau in 0.5..0.99 the rank of softmax>=tau(L) (as a
  database) and the softmax>=tau accuracy, next to rank(D).
* ``bound``:  the rank bound on L against L's CP-rank estimate and flattening lower bound, on random
  and on trained layers.
* ``measure``: databases through every measure: triples, the paper's bound, certified bounds, exact
  rank, CP estimate, effective rank.
* ``scale``:  databases of >= 20,000 triples through the same measures (CP fits by batched sparse ALS)
  and through training, with the time of each stage (``rank/`` and ``train/``).
* ``rank`` and ``train``: the measures, and a grid of trained layers, on a database CSV.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from auditor.core.atomic import real_folder
from auditor.core.errors import AuditError
from auditor.lab.engine import TrainConfig
from auditor.lab.experiment import Experiment, option
from auditor.lab.facts import plots
from auditor.lab.facts.cp import BACKENDS, CPConfig, estimate_cp_rank
from auditor.lab.facts.database import GENERATORS, DatabaseSpec, load_csv
from auditor.lab.facts.effective import effective_rank
from auditor.lab.facts.exact import exact_rank
from auditor.lab.facts.layer_tensor import (
    architecture_bound,
    bound_decomposition,
    flattening_lower_bound,
    layer_tensor,
    threshold_database,
)
from auditor.lab.facts.model import FactLayer, LayerConfig
from auditor.lab.facts.tensor import rank_bounds, reconstruct
from auditor.lab.facts.training import TAUS, train_layers
from auditor.lab.sweep import file_fingerprint

TRAIN = {"steps": 2000, "lr": 3e-3, "optimizer": "adam", "eval_every": 50}  # full batch: 2000 epochs
TAU_GRID = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99)
EXACT_CORE_LIMIT = 4096  # exact-rank attempts (pencil) only on compressed cores up to this many entries


def _train_config(config: dict[str, Any]) -> TrainConfig:
    return TrainConfig(**{**TRAIN, **config.get("train", {})})


def _members(config: dict[str, Any]) -> list[LayerConfig]:
    return [LayerConfig(**m) for m in config["members"]]


def _stamp(rows: list[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """Add what the unit ran to every row: experiment, database spec, dtype, torch threads, training."""
    db_spec = config.get("db", {"csv": config["database"]} if "database" in config else {})
    extra = {"experiment": config["experiment"], "db_spec": db_spec, "dtype": "float32",
             "torch_threads": torch.get_num_threads()}
    if "members" in config:  # the unit trained layers
        extra["train_config"] = _train_config(config).to_dict()
    return [{**row, **extra} for row in rows]


# ---------------------------------------------------------------- unit functions


def train_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train every member of the unit on its database; one row per member (width, budget)."""
    db = DatabaseSpec(**config["db"]).build()
    bounds = rank_bounds(db)
    trained = train_layers(db, _members(config), _train_config(config), batch_size=config.get("batch_size"))
    rows = [{**row, "bounds_lower": bounds.lower, "bounds_upper": bounds.upper, "bounds_exact": bounds.exact,
             "on_budget": row["d_qk"] + row["d_vo"] == row["d_model"] + 1} for row in trained.rows]
    return _stamp(rows, config)


def tau_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train the members on the unit's database (generated, or a CSV), then per member and tau: rank of
    softmax>=tau(L) and softmax>=tau accuracy."""
    db = _csv(config) if "database" in config else DatabaseSpec(**config["db"]).build()
    cp = CPConfig(**config.get("cp", {}))
    d_bounds, d_est = rank_bounds(db), estimate_cp_rank(db, cp)
    trained = train_layers(db, _members(config), _train_config(config), taus=config["taus"])
    rows = []
    for e, base in enumerate(trained.rows):
        lt = layer_tensor(trained.model, e)
        L = lt.full()
        l_bound, _ = bound_decomposition(lt)
        for tau in config["taus"]:
            s_db = threshold_database(L, tau)
            row = {k: v for k, v in base.items() if not k.startswith("acc_tau")}
            row.update(tau=tau, acc_tau=base[f"acc_tau{tau:g}"], thresholded_triples=s_db.num_triples,
                       bounds_lower=d_bounds.lower, bounds_upper=d_bounds.upper, cp_rank=d_est.rank,
                       layer_bound=l_bound.bound, layer_flattening_lower=flattening_lower_bound(L))
            if s_db.num_triples:
                b, est = rank_bounds(s_db), estimate_cp_rank(s_db, cp)
                row.update(s_rank_lower=b.lower, s_rank_upper=b.upper, s_cp_rank=est.rank,
                           s_cp_reached_by=est.reached_by, s_cp_seconds=est.seconds)
            else:
                row.update(
                    s_rank_lower=0, s_rank_upper=0, s_cp_rank=0, s_cp_reached_by="empty", s_cp_seconds=0.0
                )
            rows.append({**row, "cp_tolerance": cp.tolerance})
    return _stamp(rows, config)


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


def bound_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Random or trained layers: the bound on rank(L) against L's CP estimate and lower bound."""
    db = DatabaseSpec(**config["db"]).build()
    members = _members(config)
    trained = config["state"] == "trained"
    model = (
        train_layers(db, members, _train_config(config)).model if trained else FactLayer(members, *db.shape)
    )
    cp = CPConfig(**config.get("cp", {}))
    rows = []
    for e, cfg in enumerate(members):
        row = layer_columns(model, e, cp)
        bound, lower, estimate = row["layer_bound"], row["layer_flattening_lower"], row["layer_cp_rank"]
        arch = architecture_bound(cfg, db.shape)
        rows.append({
            **db.summary(), **cfg.to_dict(), "state": config["state"], **row, "architecture_bound": arch,
            "cp_tolerance": cp.tolerance,
            # a flattening rank above the bound, or a construction that misses L, would refute it
            "bound_holds": lower <= bound <= arch and row["construction_residual"] <= 1e-8,
            "tight_certified": lower == bound, "loose": estimate < bound, "slack": bound - estimate,
        })
    return _stamp(rows, config)


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
    return _stamp([row], config)


def scale_train_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train the members on a large database (mini-batches); one timed row per member."""
    t0 = time.perf_counter()
    db = DatabaseSpec(**config["db"]).build()
    trained = train_layers(db, _members(config), _train_config(config), batch_size=config.get("batch_size"))
    rows = [{**row, "seconds": time.perf_counter() - t0, "batch_size": config.get("batch_size")}
            for row in trained.rows]
    return _stamp(rows, config)


def _csv(config: dict[str, Any]):
    return load_csv(config["database"], **config["columns"])


def rank_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """A database CSV through the measures: bounds, the exact rank (up to 64 per side), CP, effective."""
    db = _csv(config)
    row: dict[str, Any] = {**db.summary(), **{f"bounds_{k}": v for k, v in rank_bounds(db).to_row().items()}}
    if max(db.shape) <= 64:
        row.update(exact_rank(db).to_row())
    estimate = estimate_cp_rank(db, CPConfig(**config["cp"]), progress=True)
    row.update({f"cp_{k}": v for k, v in estimate.to_row().items()})
    return [{**row, **(effective_rank(db).to_row() if config["effective"] else {})}]


def train_csv_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every layer config trained on a database CSV as one ensemble; with ``layer_rank`` also L's bound."""
    trained = train_layers(
        _csv(config), _members(config), _train_config(config), batch_size=config["batch_size"], progress=True
    )
    cp = CPConfig(restarts=2, max_iter=500)
    return [
        {
            **row,
            **(layer_columns(trained.model, e, cp) if config["layer_rank"] else {}),
            "train_config": _train_config(config).to_dict(),
            "dtype": "float32",
        }
        for e, row in enumerate(trained.rows)
    ]


def scale_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """A unit of ``facts scale``: a database through the measures (``scale-rank``) or trained
    (``scale-train``)."""
    return measure_unit(config) if config["experiment"] == "scale-rank" else scale_train_unit(config)


# ---------------------------------------------------------------- configs: what each experiment runs

REFERENCE_DB = DatabaseSpec(kind="random", keys=32, queries=8, values_per_query=4)  # 256 triples, rank 32
QUICK_DB = DatabaseSpec(kind="random", keys=8, queries=4, values_per_query=2)
QUICK = {"steps": 60, "eval_every": 20}  # the training of every --scale quick
_PLANTED = {"kind": "planted", "keys": 40, "queries": 10, "key_groups": 4, "query_groups": 3}
_BIG = {"kind": "planted", "keys": 2000, "queries": 10, "key_groups": 8, "query_groups": 5}


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
class WidthConfig(Seeded):
    """Per database seed, every (d_model, d_vo <= d_model, init seed) with d_qk = d_model and one head."""

    db: DatabaseSpec = REFERENCE_DB
    d_models: tuple[int, ...] = (2, 4, 6, 8, 12, 16)
    d_vos: tuple[int, ...] = (1, 2, 4, 8, 16)

    def units(self) -> list[dict[str, Any]]:
        return self._units(
            "width",
            self.db,
            [
                LayerConfig(d_model=d, heads=1, d_qk=d, d_vo=v, seed=i)
                for d in self.d_models
                for v in self.d_vos
                if v <= d
                for i in self.seeds
            ],
        )


@dataclass(frozen=True)
class BudgetConfig(Seeded):
    """Per database seed, the full d_qk x d_vo grid in 1..d_model."""

    db: DatabaseSpec = REFERENCE_DB
    d_model: int = 8

    def units(self) -> list[dict[str, Any]]:
        grid = range(1, self.d_model + 1)
        return self._units(
            "budget",
            self.db,
            [
                LayerConfig(d_model=self.d_model, heads=1, d_qk=qk, d_vo=vo, seed=i)
                for qk in grid
                for vo in grid
                for i in self.seeds
            ],
        )


@dataclass(frozen=True)
class GeneratedDatabase:
    """Command-line changes to an experiment's generated database; a field left None keeps the
    experiment's value (the defaults shown are ``facts tau``'s). Same flags as ``audit facts generate``."""

    kind: str | None = option(None, "Generator of the database.", choices=GENERATORS, default_help="random")
    keys: int | None = option(None, "|K| of the generated database.", default_help="32")
    queries: int | None = option(None, "|Q| (relations) of the generated database.", default_help="8")
    values_per_query: int | None = option(None, "Values each relation owns (or the shared vocabulary size).",
                                          default_help="8")
    shared_values: bool | None = option(
        None, "One value vocabulary shared by every relation.", default_help="on"
    )
    density: float | None = option(
        None, "Fraction of (key, query) pairs present, in (0, 1].", default_help="1.0"
    )
    key_groups: int | None = option(None, "planted: key groups.", default_help="4")
    query_groups: int | None = option(None, "planted: query groups.", default_help="2")
    noise: float | None = option(
        None, "planted: fraction of facts relabelled, in [0, 1].", default_help="0.0"
    )

    def changes(self) -> dict[str, Any]:
        """The fields that were set."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def flags(self) -> list[str]:
        return ["--" + k.replace("_", "-") for k in self.changes()]

    def apply(self, spec: DatabaseSpec) -> DatabaseSpec:
        """``spec`` with the fields that were set (validated by :class:`DatabaseSpec`)."""
        return replace(spec, **self.changes())


@dataclass(frozen=True)
class TauConfig(Seeded):
    """Layers with d_qk = d_model and d_vo = d_model (or each of ``d_vo``), on a generated database
    (by default 8 values shared by all relations, so that rank(D), certified in [32, 63], is not simply
    the number of values; one unit per database seed) or on a database CSV (one unit)."""

    database: str | None = option(
        None,
        "Database CSV with a header row (e.g. written by `audit facts generate`).",
        argument=True,
        default_help="a generated database",
    )
    key_col: str = option("key", "CSV column of the key.")
    query_col: str = option("query", "CSV column of the query.")
    value_col: str = option("value", "CSV column of the value.")
    generated: GeneratedDatabase = field(default=GeneratedDatabase(), metadata={"nested": True})
    db: DatabaseSpec = DatabaseSpec(kind="random", keys=32, queries=8, values_per_query=8, shared_values=True)
    db_seeds: tuple[int, ...] | None = option(None, "Seeds of the generated database (one unit each).",
                                              default_help="0")
    d_models: tuple[int, ...] = option(
        (2, 4, 8, 16), "Widths d_model (= d_qk), list or range.", flag="--d-model"
    )
    d_vos: tuple[int, ...] | None = option(None, "d_head,vo values (d_qk stays d_model).",
                                           flag="--d-vo", default_help="d_model")
    taus: tuple[float, ...] = option(TAU_GRID, "Thresholds tau, each in (0, 1).", flag="--tau")

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = [t for t in self.taus if not 0 < t < 1]
        if bad:
            raise AuditError(f"--tau takes thresholds in (0, 1), e.g. 0.5,0.9,0.95; got {bad[0]:g}")
        if self.database is None:
            self.spec()  # a bad generator option fails here, before any folder exists
            return
        clash = self.generated.flags() + (["--db-seeds"] if self.db_seeds is not None else [])
        if clash:
            raise AuditError(f"a DATABASE csv replaces the generated database; leave out {', '.join(clash)}")
        load_csv(self.database, **self.columns())  # a missing file, an unknown column or a clash: here

    def spec(self) -> DatabaseSpec:
        """The generated database (seed 0; each unit sets its own)."""
        return self.generated.apply(self.db)

    def columns(self) -> dict[str, str]:
        return {"key": self.key_col, "query": self.query_col, "value": self.value_col}

    def units(self) -> list[dict[str, Any]]:
        members = [LayerConfig(d_model=d, heads=1, d_qk=d, d_vo=v, seed=i)
                   for d in self.d_models for v in (self.d_vos or [d]) for i in self.seeds]
        extra = {"taus": list(self.taus), "cp": {"tolerance": 1e-3, "restarts": 2, "max_iter": 500}}
        layers = [m.to_dict() for m in members]
        if self.database is None:
            return [
                {
                    "experiment": "tau",
                    "db": {**self.spec().to_dict(), "seed": s},
                    "members": layers,
                    **extra,
                    "train": self.train(),
                }
                for s in self.db_seeds or (0,)
            ]
        return [{"experiment": "tau", "database": str(Path(self.database).resolve()),
                 "fingerprint": file_fingerprint(self.database), "columns": self.columns(), "members": layers,
                 **extra, "train": self.train()}]


@dataclass(frozen=True)
class BoundConfig(Training):
    """One unit per state (random, trained) over the same layer shapes."""

    db: DatabaseSpec = DatabaseSpec(kind="random", keys=6, queries=4, values_per_query=3)
    members: tuple[LayerConfig, ...] = tuple(
        LayerConfig(d_model=d, heads=h, d_qk=qk, d_vo=vo, seed=i)
        for i, (d, h, qk, vo) in enumerate(
            [(2, 1, 2, 1), (4, 1, 4, 1), (4, 1, 1, 4), (4, 2, 2, 2), (8, 1, 8, 1), (8, 1, 2, 4), (8, 2, 4, 2)]
        )
    )
    cp: tuple[tuple[str, Any], ...] = (("tolerance", 1e-4), ("restarts", 2), ("max_iter", 500))

    def units(self) -> list[dict[str, Any]]:
        return [
            {
                "experiment": "bound",
                "db": self.db.to_dict(),
                "members": [m.to_dict() for m in self.members],
                "state": s,
                "train": self.train(),
                "cp": dict(self.cp),
            }
            for s in ("random", "trained")
        ]


@dataclass(frozen=True)
class MeasureConfig:
    dbs: tuple[DatabaseSpec, ...] = (
        DatabaseSpec(keys=6, queries=3, values_per_query=3, shared_values=True, seed=1),
        DatabaseSpec(keys=16, queries=4, values_per_query=4, shared_values=True, density=0.75),
        REFERENCE_DB,
        DatabaseSpec(keys=32, queries=8, values_per_query=8, shared_values=True),
        DatabaseSpec(keys=64, queries=4, values_per_query=16, shared_values=True),
        DatabaseSpec(**_PLANTED),
        DatabaseSpec(**_PLANTED, shared_values=True, values_per_query=5),
        DatabaseSpec(**_PLANTED, noise=0.05),
    )

    def units(self) -> list[dict[str, Any]]:
        return [{"experiment": "measure", "db": db.to_dict(), "cp": {}, "effective": True} for db in self.dbs]


@dataclass(frozen=True)
class ScaleConfig(Training):
    """Four 20,000-triple databases (2000 keys x 10 relations): random with 10 values per relation (rank
    certified = 100), planted 8 x 5 blocks with distinct values (certified 40; both fitted once on the
    full tensor by the batched ALS, to time it), planted blocks with 10 shared values and planted with
    0.2% of the facts relabelled (open rank intervals that the CP search settles on the compressed core);
    training on the first and the last."""

    dbs: tuple[DatabaseSpec, ...] = (
        DatabaseSpec(kind="random", keys=2000, queries=10, values_per_query=10),
        DatabaseSpec(**_BIG),
        DatabaseSpec(**_BIG, shared_values=True, values_per_query=10),
        DatabaseSpec(**_BIG, noise=0.002),
    )
    train_dbs: tuple[int, ...] = (0, -1)  # indices into dbs
    members: tuple[LayerConfig, ...] = tuple(
        LayerConfig(d_model=d, heads=2, d_qk=d, d_vo=d) for d in (16, 32, 64)
    )
    batch_size: int = 2048
    effective: bool = True  # effective-rank search on the planted databases

    def units(self) -> list[dict[str, Any]]:
        rank = [
            {
                "experiment": "scale-rank",
                "db": db.to_dict(),  # the first two fitted on the full tensor
                "cp": {
                    "tolerance": 1e-4,
                    "restarts": 4 if db.kind == "random" else 2,
                    "max_iter": 1000,
                    "backend": "als",
                    "compress": i >= 2,
                    "verify_ceiling": i < 2,
                },
                "effective": self.effective and db.kind == "planted",
                "effective_max": 16,
            }
            for i, db in enumerate(self.dbs)
        ]
        train = [
            {
                "experiment": "scale-train",
                "db": self.dbs[i].to_dict(),
                "members": [m.to_dict() for m in self.members],
                "train": {"steps": 2000, "lr": 1e-2, "eval_every": 100, **self.train()},
                "batch_size": self.batch_size,
            }
            for i in dict.fromkeys(j % len(self.dbs) for j in self.train_dbs)
        ]
        return rank + train


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


@dataclass(frozen=True)
class RankConfig(CSVDatabase):
    cp_tolerance: float = option(1e-4, "Relative error at which a CP rank fits.")
    restarts: int = option(4, "Random restarts per rank.")
    max_iter: int = option(3000, "ALS sweeps per fit.")
    backend: str = option("auto", "CP fitting backend.", choices=BACKENDS)
    effective: bool = option(False, "Also search the effective (argmax) rank (trains CP logits).")

    def __post_init__(self) -> None:
        super().__post_init__()
        CPConfig(**self.cp())

    def cp(self) -> dict[str, Any]:
        return {"tolerance": self.cp_tolerance, "restarts": self.restarts, "max_iter": self.max_iter,
                "backend": self.backend}

    def units(self) -> list[dict[str, Any]]:
        return self.unit("rank", cp=self.cp(), effective=self.effective)


@dataclass(frozen=True)
class TrainLayersConfig(CSVDatabase):
    d_model: tuple[int, ...] = option((8,), "Widths d_model (list or range).", flag="--d-model")
    heads: tuple[int, ...] = option((1,), "Head counts.")
    d_qk: tuple[int, ...] | None = option(None, "d_head,qk values.", default_help="d_model")
    d_vo: tuple[int, ...] | None = option(None, "d_head,vo values.", default_help="d_model")
    budget: bool = option(False, "Pair each d_vo with d_qk = d_model - d_vo + 1 instead of a grid.")
    seeds: tuple[int, ...] = option((0,), "Initialisation seeds.")
    steps: int = option(2000, "Training steps.")
    lr: float = option(3e-3, "Peak Adam learning rate.", parse="floats")
    batch_size: int | None = option(None, "Triples per step.", default_help="full batch")
    layer_rank: bool = option(False, "Also compute the layer tensor L's bound and CP estimate.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget and self.d_vo and max(self.d_vo) > min(self.d_model):
            raise AuditError("--budget needs every d_vo <= d_model (so that d_qk = d_model - d_vo + 1 >= 1)")
        if self.batch_size is not None and self.batch_size < 1:
            raise AuditError(f"--batch-size must be >= 1, got {self.batch_size}")
        TrainConfig(steps=self.steps, lr=self.lr, eval_every=50)

    def units(self) -> list[dict[str, Any]]:
        members = [LayerConfig(d_model=d, heads=h, d_qk=qk, d_vo=vo, seed=s)
                   for d in self.d_model for h in self.heads for vo in self.d_vo or [d]
                   for qk in ([d - vo + 1] if self.budget else (self.d_qk or [d])) for s in self.seeds]
        return self.unit(
            "train",
            members=[m.to_dict() for m in members],
            batch_size=self.batch_size,
            train={"steps": self.steps, "lr": self.lr, "eval_every": 50},
            layer_rank=self.layer_rank,
        )


# ---------------------------------------------------------------- the experiments

_IDS = ("db", "triples", "keys", "queries", "values", "density")
_LAYER = ("d_model", "heads", "d_qk", "d_vo", "seed")
_TRAINED = ("parameters", "accuracy", "facts_stored", *(f"acc_tau{t:g}" for t in TAUS), "steps_trained",
            "early_stopped", "train_seconds", "bucket_members")
_STAMP = ("experiment", "db_spec", "dtype", "torch_threads", "train_config")
_BOUND_PARTS = ("bound", "joint", "key_side", "query_side", "slice_bound", "construction", "direct_rank",
                "attention_ranks", "value_ranks")
_LAYER_BOUND = (*(f"layer_{k}" for k in _BOUND_PARTS), "construction_residual", "layer_flattening_lower",
                "layer_cp_rank", "layer_cp_reached_by", "layer_cp_seconds")
_BOUNDS = tuple(f"bounds_{k}" for k in ("lower", "upper", "paper_bound", "value_slice_bound", "flattening",
                                        "core_shape", "exact"))
_CP = tuple(
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
_EFFECTIVE = ("effective_rank", "effective_lower", "effective_exact", "effective_seconds", "effective_tried")
_MEASURED = (*_IDS, "seed", "build_seconds", *_BOUNDS, "bounds_seconds", "exact_rank", "exact_method", *_CP,
             *_EFFECTIVE)
KEY_DEFAULTS = {
    "db": DatabaseSpec,
    "members": [LayerConfig],
    "cp": CPConfig,
}  # a unit's key leaves these defaults out
_SHOW_TRAINED = (
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


def _facts(name: str, help: str, config: type, run_unit: Callable[[dict[str, Any]], list[dict[str, Any]]],
           columns: tuple[str, ...], **kwargs: Any) -> Experiment:
    """A facts experiment: its config splits into units, each run by ``run_unit`` through the shared
    runner."""
    draw = plots.PLOTS.get(name)
    return Experiment(name=f"facts {name}", help=help, config=config, units=lambda c, out: c.units(),
                      run_unit=run_unit, columns=tuple(dict.fromkeys(columns)),
                      plots=(lambda frame, out, c: draw(frame, out)) if draw else None,
                      key_defaults=KEY_DEFAULTS, **kwargs)


_SEEDED = {"show": _SHOW_TRAINED}
WIDTH = _facts(
    "width",
    "Accuracy against d_model and d_vo (d_qk = d_model, one head), per database seed.",
    WidthConfig,
    train_unit,
    (*_IDS, *_LAYER, *_TRAINED, "bounds_lower", "bounds_upper", "bounds_exact", "on_budget", *_STAMP),
    presets={
        "quick": {
            "db": QUICK_DB,
            "d_models": (2, 4),
            "d_vos": (1, 2),
            "db_seeds": (0,),
            "seeds": (0,),
            **QUICK,
        }
    },
    **_SEEDED,
)
BUDGET = _facts(
    "budget",
    "The full d_qk x d_vo grid at a fixed d_model; its anti-diagonal is Paper B's fixed parameter budget.",
    BudgetConfig,
    train_unit,
    WIDTH.columns,
    presets={"quick": {"db": QUICK_DB, "d_model": 3, "db_seeds": (0,), "seeds": (0,), **QUICK}},
    **_SEEDED,
)
TAU = _facts(
    "tau",
    "Trained layers: rank of softmax>=tau(L) and the softmax>=tau accuracy for tau in 0.5..0.99, "
    "beside rank(D); on a generated database (change it with --keys, --queries, ...) or a DATABASE csv.",
    TauConfig,
    tau_unit,
    (
        *_IDS,
        *_LAYER,
        *[c for c in _TRAINED if not c.startswith("acc_tau")],
        "tau",
        "acc_tau",
        "thresholded_triples",
        "bounds_lower",
        "bounds_upper",
        "cp_rank",
        "layer_bound",
        "layer_flattening_lower",
        "s_rank_lower",
        "s_rank_upper",
        "s_cp_rank",
        "s_cp_reached_by",
        "s_cp_seconds",
        "cp_tolerance",
        *_STAMP,
    ),
    presets={"quick": {"db": QUICK_DB, "d_models": (2, 4), "taus": (0.5, 0.9), "seeds": (0,), **QUICK}},
    show=("d_model", "seed", "tau", "acc_tau", "s_cp_rank", "layer_bound", "cp_rank"),
    examples="audit facts tau --keys 32 --queries 8 --values-per-query 4 "
    "--no-shared-values --d-model 2:6,8,16\n"
    "audit facts tau db.csv --d-model 4,8 --tau 0.5,0.95 --steps 500 --lr 1e-2",
)
BOUND = _facts(
    "bound",
    "The bound on rank(L) against L's CP-rank estimate and flattening lower bound, random and "
    "trained layers.",
    BoundConfig,
    bound_unit,
    (
        *_IDS,
        *_LAYER,
        "state",
        *_LAYER_BOUND,
        "architecture_bound",
        "cp_tolerance",
        "bound_holds",
        "tight_certified",
        "loose",
        "slack",
        *_STAMP,
    ),
    presets={
        "quick": {
            "db": DatabaseSpec(keys=4, queries=3, values_per_query=2),
            **QUICK,
            "members": (
                LayerConfig(d_model=2, d_qk=1, d_vo=1),
                LayerConfig(d_model=3, heads=2, d_qk=2, d_vo=1),
            ),
            "cp": (("tolerance", 1e-3), ("restarts", 1), ("max_iter", 200)),
        }
    },
    show=(
        "d_model",
        "heads",
        "d_qk",
        "d_vo",
        "state",
        "layer_bound",
        "layer_cp_rank",
        "layer_flattening_lower",
        "architecture_bound",
        "bound_holds",
    ),
)
MEASURE = _facts(
    "measure",
    "Databases through every measure: triples, the paper's bound, certified bounds, exact "
    "rank, CP estimate, effective rank.",
    MeasureConfig,
    measure_unit,
    (*_MEASURED, *_STAMP),
    presets={
        "quick": {
            "dbs": (QUICK_DB, DatabaseSpec(keys=5, queries=3, values_per_query=2, shared_values=True, seed=1))
        }
    },
    show=("db", "triples", "bounds_lower", "bounds_upper", "exact_rank", "cp_rank", "effective_rank"),
)
SCALE = _facts(
    "scale",
    "Databases of >= 20,000 triples through the measures (batched sparse ALS) and through "
    "training, with the time of each stage (rank/ and train/).",
    ScaleConfig,
    scale_unit,
    (*_MEASURED, *_LAYER, *_TRAINED, "seconds", "batch_size", *_STAMP),
    presets={
        "quick": {
            "dbs": (DatabaseSpec(keys=200, queries=10, values_per_query=10),),
            "batch_size": 512,
            "members": (LayerConfig(d_model=16, heads=2, d_qk=16, d_vo=16),),
            "effective": False,
            **QUICK,
        }
    },
    folder=lambda unit: unit["experiment"].removeprefix("scale-"),
    show=("db", "triples", "bounds_exact", "cp_rank", "cp_seconds", "d_model", "accuracy", "train_seconds"),
)
RANK = _facts(
    "rank",
    "Measure a database CSV: triples, the paper's bound, certified bounds, exact rank, CP estimate.",
    RankConfig,
    rank_unit,
    (
        *_IDS,
        *_BOUNDS,
        "exact_rank",
        "exact_lower",
        "exact_upper",
        "exact_method",
        "exact_core_shape",
        *_CP,
        *_EFFECTIVE,
    ),
    presets={"quick": {"restarts": 1, "max_iter": 500}},
    show=(
        "db",
        "triples",
        "keys",
        "queries",
        "values",
        "bounds_paper_bound",
        "bounds_value_slice_bound",
        "bounds_lower",
        "bounds_upper",
        "exact_rank",
        "exact_method",
        "cp_rank",
        "cp_reached_by",
        "cp_tolerance",
        "effective_rank",
    ),
)
TRAIN_LAYERS = _facts(
    "train",
    "Train one attention-only layer per configuration on a database CSV (all batched); "
    "report the accuracies.",
    TrainLayersConfig,
    train_csv_unit,
    (*_IDS, *_LAYER, *_TRAINED, *_LAYER_BOUND, "train_config", "dtype"),
    presets={"quick": {"steps": 100}},
    show=_SHOW_TRAINED,
)


def plot_results(results: str | Path, out: str | Path | None = None) -> list[Path]:
    """Draw the plot of the experiment recorded in ``results`` (a results.csv or its folder)."""
    path = Path(results)
    path = path / "results.csv" if path.is_dir() else path
    if not path.is_file():
        raise AuditError(f"no results file at {str(path)!r}; give a sweep folder or its results.csv")
    frame = pd.read_csv(path)
    if frame.empty or "experiment" not in frame:
        raise AuditError(f"{str(path)!r} has no facts experiment rows")
    name = str(frame["experiment"].iloc[0])
    if name not in plots.PLOTS:
        return []
    target = Path(out) if out is not None else path.parent
    real_folder(target)
    return plots.PLOTS[name](frame, target)
