"""``audit facts scale``: databases of >= 20,000 triples through the measures (CP fits by batched sparse ALS)
and through training, with the time of each stage (``rank/`` and ``train/``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from auditor.lab.facts.database import DatabaseSpec
from auditor.lab.facts.model import LayerConfig
from auditor.lab.facts.shared import (
    LAYER,
    MEASURED,
    QUICK,
    STAMP,
    TRAINED,
    Training,
    facts_experiment,
    measure_unit,
    members_of,
    stamp,
    train_config,
)
from auditor.lab.facts.training import train_layers

BIG = {"kind": "planted", "keys": 2000, "queries": 10, "key_groups": 8, "query_groups": 5}

def scale_train_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Train the members on a large database (mini-batches); one timed row per member."""
    t0 = time.perf_counter()
    db = DatabaseSpec(**config["db"]).build()
    trained = train_layers(db, members_of(config), train_config(config), batch_size=config.get("batch_size"))
    rows = [{**row, "seconds": time.perf_counter() - t0, "batch_size": config.get("batch_size")}
            for row in trained.rows]
    return stamp(rows, config)


def scale_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """A unit of ``facts scale``: a database through the measures (``scale-rank``) or trained
    (``scale-train``)."""
    return measure_unit(config) if config["experiment"] == "scale-rank" else scale_train_unit(config)


@dataclass(frozen=True)
class ScaleConfig(Training):
    """Four 20,000-triple databases (2000 keys x 10 relations): random with 10 values per relation (rank
    certified = 100), planted 8 x 5 blocks with distinct values (certified 40; both fitted once on the
    full tensor by the batched ALS, to time it), planted blocks with 10 shared values and planted with
    0.2% of the facts relabelled (open rank intervals that the CP search settles on the compressed core);
    training on the first and the last."""

    dbs: tuple[DatabaseSpec, ...] = (
        DatabaseSpec(kind="random", keys=2000, queries=10, values_per_query=10),
        DatabaseSpec(**BIG),
        DatabaseSpec(**BIG, shared_values=True, values_per_query=10),
        DatabaseSpec(**BIG, noise=0.002),
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


SCALE = facts_experiment(
    "scale",
    "Databases of >= 20,000 triples through the measures (batched sparse ALS) and through "
    "training, with the time of each stage (rank/ and train/).",
    ScaleConfig,
    scale_unit,
    (*MEASURED, *LAYER, *TRAINED, "seconds", "batch_size", *STAMP),
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
