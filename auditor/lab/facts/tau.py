"""``audit facts tau``: trained layers of several widths; for tau in 0.5..0.99 the rank of softmax>=tau(L)
(as a database) and the softmax>=tau accuracy, next to rank(D).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from auditor.core.errors import AuditError
from auditor.lab.experiment import option
from auditor.lab.facts.cp import CPConfig, estimate_cp_rank
from auditor.lab.facts.database import GENERATORS, DatabaseSpec, load_csv
from auditor.lab.facts.layer_tensor import (
    bound_decomposition,
    flattening_lower_bound,
    layer_tensor,
    threshold_database,
)
from auditor.lab.facts.model import LayerConfig
from auditor.lab.facts.shared import (
    IDS,
    LAYER,
    QUICK,
    QUICK_DB,
    STAMP,
    TRAINED,
    Seeded,
    csv_database,
    facts_experiment,
    members_of,
    stamp,
    train_config,
)
from auditor.lab.facts.tensor import rank_bounds
from auditor.lab.facts.training import train_layers
from auditor.lab.sweep import file_fingerprint

TAU_GRID = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99)

def tau_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train the members on the unit's database (generated, or a CSV), then per member and tau: rank of
    softmax>=tau(L) and softmax>=tau accuracy."""
    db = csv_database(config) if "database" in config else DatabaseSpec(**config["db"]).build()
    cp = CPConfig(**config.get("cp", {}))
    d_bounds, d_est = rank_bounds(db), estimate_cp_rank(db, cp)
    trained = train_layers(db, members_of(config), train_config(config), taus=config["taus"])
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
    return stamp(rows, config)


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


TAU = facts_experiment(
    "tau",
    "Trained layers: rank of softmax>=tau(L) and the softmax>=tau accuracy for tau in 0.5..0.99, "
    "beside rank(D); on a generated database (change it with --keys, --queries, ...) or a DATABASE csv.",
    TauConfig,
    tau_unit,
    (
        *IDS,
        *LAYER,
        *[c for c in TRAINED if not c.startswith("acc_tau")],
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
        *STAMP,
    ),
    presets={"quick": {"db": QUICK_DB, "d_models": (2, 4), "taus": (0.5, 0.9), "seeds": (0,), **QUICK}},
    show=("d_model", "seed", "tau", "acc_tau", "s_cp_rank", "layer_bound", "cp_rank"),
    examples="audit facts tau --keys 32 --queries 8 --values-per-query 4 "
    "--no-shared-values --d-model 2:6,8,16\n"
    "audit facts tau db.csv --d-model 4,8 --tau 0.5,0.95 --steps 500 --lr 1e-2",
)
