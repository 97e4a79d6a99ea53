"""``audit facts measure``: databases through every measure: triples, the paper's bound, certified bounds,
exact rank, CP estimate, effective rank (the unit function, :func:`~.shared.measure_unit`, also runs
``facts scale``'s rank units).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from auditor.lab.facts.database import DatabaseSpec
from auditor.lab.facts.shared import MEASURED, QUICK_DB, REFERENCE_DB, STAMP, facts_experiment, measure_unit

PLANTED = {"kind": "planted", "keys": 40, "queries": 10, "key_groups": 4, "query_groups": 3}

@dataclass(frozen=True)
class MeasureConfig:
    dbs: tuple[DatabaseSpec, ...] = (
        DatabaseSpec(keys=6, queries=3, values_per_query=3, shared_values=True, seed=1),
        DatabaseSpec(keys=16, queries=4, values_per_query=4, shared_values=True, density=0.75),
        REFERENCE_DB,
        DatabaseSpec(keys=32, queries=8, values_per_query=8, shared_values=True),
        DatabaseSpec(keys=64, queries=4, values_per_query=16, shared_values=True),
        DatabaseSpec(**PLANTED),
        DatabaseSpec(**PLANTED, shared_values=True, values_per_query=5),
        DatabaseSpec(**PLANTED, noise=0.05),
    )

    def units(self) -> list[dict[str, Any]]:
        return [{"experiment": "measure", "db": db.to_dict(), "cp": {}, "effective": True} for db in self.dbs]


MEASURE = facts_experiment(
    "measure",
    "Databases through every measure: triples, the paper's bound, certified bounds, exact "
    "rank, CP estimate, effective rank.",
    MeasureConfig,
    measure_unit,
    (*MEASURED, *STAMP),
    presets={
        "quick": {
            "dbs": (QUICK_DB, DatabaseSpec(keys=5, queries=3, values_per_query=2, shared_values=True, seed=1))
        }
    },
    show=("db", "triples", "bounds_lower", "bounds_upper", "exact_rank", "cp_rank", "effective_rank"),
)
