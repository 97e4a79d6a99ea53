"""The experiments of the facts room, as resumable sweeps (:func:`auditor.lab.sweep.run_sweep`).

Each experiment is a list of unit configs (plain JSON) and a module-level unit function. A unit trains
one batched ensemble (every layer shape of the unit at once, through the lab engine) and returns one
row per member (or per member and tau); every row carries the unit's config, seeds, dtype, device and
the provenance columns.

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
  and through training, with the time of each stage.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from auditor.errors import AuditError, did_you_mean
from auditor.lab.engine import TrainConfig
from auditor.lab.facts.cp import CPConfig, estimate_cp_rank
from auditor.lab.facts.database import DatabaseSpec
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
from auditor.lab.facts.training import train_layers
from auditor.provenance import provenance

TRAIN = {"steps": 2000, "lr": 3e-3, "optimizer": "adam", "eval_every": 50}  # full batch: 2000 epochs
TAU_GRID = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99)


def _train_config(config: dict[str, Any]) -> TrainConfig:
    return TrainConfig(**{**TRAIN, **config.get("train", {})})


def _stamp(rows: list[dict[str, Any]], config: dict[str, Any]) -> list[dict[str, Any]]:
    """Add the unit's config and the provenance columns to every row."""
    extra = {
        "experiment": config["experiment"],
        "db_spec": json.dumps(config.get("db", {}), sort_keys=True),
        "dtype": "float32",
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        **provenance(),
    }
    if "members" in config:  # the unit trained layers
        extra["train_config"] = json.dumps(_train_config(config).to_dict(), sort_keys=True)
    return [{**row, **extra} for row in rows]


def _members(config: dict[str, Any]) -> list[LayerConfig]:
    return [LayerConfig(**m) for m in config["members"]]


# ---------------------------------------------------------------- width and budget


def train_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train every member of the unit on its database; one row per member (width, budget)."""
    db = DatabaseSpec(**config["db"]).build()
    bounds = rank_bounds(db)
    trained = train_layers(db, _members(config), _train_config(config), batch_size=config.get("batch_size"))
    rows = []
    for row in trained.rows:
        row.update(rank_lower=bounds.lower, rank_upper=bounds.upper, rank_exact=bounds.exact)
        row["on_budget"] = row["d_qk"] + row["d_vo"] == row["d_model"] + 1
        rows.append(row)
    return _stamp(rows, config)


def width_configs(
    db: DatabaseSpec,
    *,
    d_models: tuple[int, ...] = (2, 4, 6, 8, 12, 16),
    d_vos: tuple[int, ...] = (1, 2, 4, 8, 16),
    db_seeds: tuple[int, ...] = (0, 1),
    init_seeds: tuple[int, ...] = (0, 1, 2),
    train: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Units of the width experiment: per database seed, every (d_model, d_vo <= d_model, init seed),
    with d_qk = d_model and one head."""
    members = [
        LayerConfig(d_model=d, heads=1, d_qk=d, d_vo=v, seed=i).to_dict()
        for d in d_models
        for v in d_vos
        if v <= d
        for i in init_seeds
    ]
    return [
        {"experiment": "width", "db": {**db.to_dict(), "seed": s}, "members": members, "train": train or {}}
        for s in db_seeds
    ]


def budget_configs(
    db: DatabaseSpec,
    *,
    d_model: int = 8,
    heads: int = 1,
    db_seeds: tuple[int, ...] = (0, 1),
    init_seeds: tuple[int, ...] = (0, 1, 2),
    train: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Units of the budget experiment: per database seed, the full d_qk x d_vo grid in 1..d_model."""
    members = [
        LayerConfig(d_model=d_model, heads=heads, d_qk=qk, d_vo=vo, seed=i).to_dict()
        for qk in range(1, d_model + 1)
        for vo in range(1, d_model + 1)
        for i in init_seeds
    ]
    return [
        {"experiment": "budget", "db": {**db.to_dict(), "seed": s}, "members": members, "train": train or {}}
        for s in db_seeds
    ]


# ---------------------------------------------------------------- tau


def tau_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train the members, then per member and tau: rank of softmax>=tau(L) and softmax>=tau accuracy."""
    db = DatabaseSpec(**config["db"]).build()
    cp = CPConfig(**config.get("cp", {}))
    d_bounds = rank_bounds(db)
    d_est = estimate_cp_rank(db, cp)
    trained = train_layers(db, _members(config), _train_config(config), taus=config["taus"])
    rows = []
    for e, base in enumerate(trained.rows):
        lt = layer_tensor(trained.model, e)
        L = lt.full()
        l_bound, _ = bound_decomposition(lt)
        for tau in config["taus"]:
            s_db = threshold_database(L, tau)
            row = {k: v for k, v in base.items() if not k.startswith("acc_tau")}
            row.update(tau=tau, acc_tau=base[f"acc_tau{tau:g}"], thresholded_triples=s_db.num_triples)
            row.update(db_rank_lower=d_bounds.lower, db_rank_upper=d_bounds.upper, db_cp_rank=d_est.rank)
            row.update(layer_bound=l_bound.bound, layer_flattening_lower=flattening_lower_bound(L))
            if s_db.num_triples:
                b = rank_bounds(s_db)
                est = estimate_cp_rank(s_db, cp)
                row.update(
                    s_rank_lower=b.lower,
                    s_rank_upper=b.upper,
                    s_cp_rank=est.rank,
                    s_cp_reached_by=est.reached_by,
                    s_cp_seconds=est.seconds,
                )
            else:
                row.update(
                    s_rank_lower=0, s_rank_upper=0, s_cp_rank=0, s_cp_reached_by="empty", s_cp_seconds=0.0
                )
            row["cp_tol"] = cp.tol
            rows.append(row)
    return _stamp(rows, config)


def tau_configs(
    db: DatabaseSpec,
    *,
    d_models: tuple[int, ...] = (2, 4, 8, 16),
    db_seeds: tuple[int, ...] = (0,),
    init_seeds: tuple[int, ...] = (0,),
    taus: tuple[float, ...] = TAU_GRID,
    train: dict[str, Any] | None = None,
    cp: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Units of the tau experiment: per database seed, layers with d_qk = d_vo = d_model."""
    members = [
        LayerConfig(d_model=d, heads=1, d_qk=d, d_vo=d, seed=i).to_dict()
        for d in d_models
        for i in init_seeds
    ]
    return [
        {
            "experiment": "tau",
            "db": {**db.to_dict(), "seed": s},
            "members": members,
            "taus": list(taus),
            "train": train or {},
            "cp": cp or {"tol": 1e-3, "restarts": 2, "max_iter": 500},
        }
        for s in db_seeds
    ]


# ---------------------------------------------------------------- bound


def bound_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Random or trained layers: the bound on rank(L) against L's CP estimate and lower bound."""
    db = DatabaseSpec(**config["db"]).build()
    members = _members(config)
    if config["state"] == "trained":
        model = train_layers(db, members, _train_config(config)).model
    else:
        model = FactLayer(members, *db.shape)
    cp = CPConfig(**config.get("cp", {}))
    rows = []
    for e, cfg in enumerate(members):
        lt = layer_tensor(model, e)
        L = lt.full()
        bound, factors = bound_decomposition(lt)
        residual = float(np.linalg.norm(reconstruct(factors) - L) / np.linalg.norm(L))
        est = estimate_cp_rank(L, cp, ceiling=bound.bound, ceiling_certified=residual <= 1e-8)
        lower = flattening_lower_bound(L)
        arch = architecture_bound(cfg, db.shape)
        rows.append(
            {
                **db.summary(),
                **cfg.to_dict(),
                "state": config["state"],
                **bound.to_row(),
                "construction_residual": residual,
                "architecture_bound": arch,
                "flattening_lower": lower,
                "cp_rank": est.rank,
                "cp_reached_by": est.reached_by,
                "cp_tol": cp.tol,
                "cp_seconds": est.seconds,
                # a flattening rank above the bound, or a construction that misses L, would refute it
                "bound_holds": lower <= bound.bound <= arch and residual <= 1e-8,
                "tight_certified": lower == bound.bound,
                "loose": est.rank < bound.bound,
                "slack": bound.bound - est.rank,
            }
        )
    return _stamp(rows, config)


def bound_configs(
    db: DatabaseSpec,
    *,
    members: list[LayerConfig] | None = None,
    states=("random", "trained"),
    train: dict[str, Any] | None = None,
    cp: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Units of the bound experiment: one per state over the same layer shapes."""
    if members is None:
        members = [
            LayerConfig(d_model=d, heads=h, d_qk=qk, d_vo=vo, seed=i)
            for i, (d, h, qk, vo) in enumerate(
                [
                    (2, 1, 2, 1),
                    (4, 1, 4, 1),
                    (4, 1, 1, 4),
                    (4, 2, 2, 2),
                    (8, 1, 8, 1),
                    (8, 1, 2, 4),
                    (8, 2, 4, 2),
                ]
            )
        ]
    return [
        {
            "experiment": "bound",
            "db": db.to_dict(),
            "members": [m.to_dict() for m in members],
            "state": s,
            "train": train or {},
            "cp": cp or {"tol": 1e-4, "restarts": 2, "max_iter": 500},
        }
        for s in states
    ]


# ---------------------------------------------------------------- measure and scale

EXACT_CORE_LIMIT = 4096  # exact-rank attempts (pencil) only on compressed cores up to this many entries


def measure_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """One database through every measure, each timed: the certified bounds, the exact rank when the
    bounds leave it open on a small core, the CP estimate and (optionally) the effective rank."""
    t0 = time.perf_counter()
    db = DatabaseSpec(**config["db"]).build()
    row: dict[str, Any] = {**db.summary(), "build_seconds": time.perf_counter() - t0}
    t0 = time.perf_counter()
    bounds = rank_bounds(db)
    row.update({f"bounds_{k}": v for k, v in bounds.to_row().items()})
    row["bounds_seconds"] = time.perf_counter() - t0
    exact = bounds.exact
    method = "bounds meet" if exact is not None else "open"
    if exact is None and np.prod(bounds.core_shape) <= EXACT_CORE_LIMIT:
        result = exact_rank(db)
        exact, method = result.rank, result.method
    row.update(exact_rank=exact, exact_method=method)
    cp = CPConfig(**config.get("cp", {}))
    est = estimate_cp_rank(db, cp)
    row.update({f"cp_{k}": v for k, v in est.to_row().items()})
    if config.get("effective", True):
        eff = effective_rank(
            db, restarts=config.get("effective_restarts", 2), max_rank=config.get("effective_max")
        )
        row.update(eff.to_row())
    return _stamp([row], config)


def measure_configs(dbs: list[DatabaseSpec], *, cp: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Units of the measure experiment: one per database."""
    return [{"experiment": "measure", "db": db.to_dict(), "cp": cp or {}, "effective": True} for db in dbs]


def scale_train_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train the members on a large database (mini-batches); one timed row per member."""
    t0 = time.perf_counter()
    db = DatabaseSpec(**config["db"]).build()
    trained = train_layers(db, _members(config), _train_config(config), batch_size=config.get("batch_size"))
    for row in trained.rows:
        row["total_seconds"] = time.perf_counter() - t0
        row["batch_size"] = config.get("batch_size")
    return _stamp(trained.rows, config)


def scale_configs(
    dbs: list[DatabaseSpec] | None = None,
    *,
    train_dbs: list[DatabaseSpec] | None = None,
    members: list[LayerConfig] | None = None,
    train: dict[str, Any] | None = None,
    batch_size: int | None = 2048,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rank units, training units) of the scale experiment; by default four 20,000-triple databases
    (2000 keys x 10 relations): random with 10 values per relation (rank certified = 100), planted
    8 x 5 blocks with distinct values (certified 40; both fitted once on the full tensor by the batched
    ALS, to time it), planted blocks with 10 shared values and planted with 0.2% of the facts relabelled
    (open rank intervals that the CP search settles on the compressed core)."""
    if dbs is None:
        planted = {"kind": "planted", "keys": 2000, "queries": 10, "key_groups": 8, "query_groups": 5}
        dbs = [
            DatabaseSpec(kind="random", keys=2000, queries=10, values_per_query=10),
            DatabaseSpec(**planted),
            DatabaseSpec(**planted, shared_values=True, values_per_query=10),
            DatabaseSpec(**planted, noise=0.002),
        ]
    if train_dbs is None:
        train_dbs = [dbs[0], dbs[-1]]
    if members is None:
        members = [LayerConfig(d_model=d, heads=2, d_qk=d, d_vo=d, seed=0) for d in (16, 32, 64)]
    rank_units = []
    for i, db in enumerate(dbs):
        full = i < 2  # the first two are fitted on the full 20,000-non-zero tensor to time the batched ALS
        cp = {
            "tol": 1e-4,
            "restarts": 4 if db.kind == "random" else 2,
            "max_iter": 1000,
            "backend": "als",
            "compress": not full,
            "verify_ceiling": full,
        }
        rank_units.append(
            {
                "experiment": "scale-rank",
                "db": db.to_dict(),
                "cp": cp,
                "effective": db.kind == "planted",
                "effective_max": 16,
            }
        )
    train_units = [
        {
            "experiment": "scale-train",
            "db": db.to_dict(),
            "members": [m.to_dict() for m in members],
            "train": {"steps": 2000, "lr": 1e-2, "eval_every": 100, **(train or {})},
            "batch_size": batch_size,
        }
        for db in train_dbs
    ]
    return rank_units, train_units


EXPERIMENTS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "width": train_unit,
    "budget": train_unit,
    "tau": tau_unit,
    "bound": bound_unit,
    "measure": measure_unit,
    "scale-rank": measure_unit,
    "scale-train": scale_train_unit,
}


def unit_function(name: str) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """The unit function of an experiment name."""
    if name not in EXPERIMENTS:
        raise did_you_mean("experiment", name, EXPERIMENTS)
    return EXPERIMENTS[name]


def check_configs(configs: list[dict[str, Any]]) -> None:
    """Validate every unit's database spec and layer configs before a sweep starts."""
    if not configs:
        raise AuditError("the sweep has no units")
    for c in configs:
        DatabaseSpec(**c["db"])
        if "members" in c:
            _members(c)
        _train_config(c)
