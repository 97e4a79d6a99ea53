"""``audit facts bound``: the rank bound on L against L's CP-rank estimate and flattening lower bound, on
random and on trained layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from auditor.lab.facts.cp import CPConfig
from auditor.lab.facts.database import DatabaseSpec
from auditor.lab.facts.layer_tensor import architecture_bound
from auditor.lab.facts.model import FactLayer, LayerConfig
from auditor.lab.facts.shared import (
    IDS,
    LAYER,
    LAYER_BOUND,
    QUICK,
    STAMP,
    Training,
    facts_experiment,
    layer_columns,
    members_of,
    stamp,
    train_config,
)
from auditor.lab.facts.training import train_layers


def bound_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Random or trained layers: the bound on rank(L) against L's CP estimate and lower bound."""
    db = DatabaseSpec(**config["db"]).build()
    members = members_of(config)
    trained = config["state"] == "trained"
    model = (
        train_layers(db, members, train_config(config)).model if trained else FactLayer(members, *db.shape)
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
    return stamp(rows, config)


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


BOUND = facts_experiment(
    "bound",
    "The bound on rank(L) against L's CP-rank estimate and flattening lower bound, random and "
    "trained layers.",
    BoundConfig,
    bound_unit,
    (
        *IDS,
        *LAYER,
        "state",
        *LAYER_BOUND,
        "architecture_bound",
        "cp_tolerance",
        "bound_holds",
        "tight_certified",
        "loose",
        "slack",
        *STAMP,
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
