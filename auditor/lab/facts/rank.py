"""``audit facts rank``: a database CSV through the measures: certified bounds, the exact rank, a CP
estimate and (optionally) the effective rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from auditor.lab.experiment import option
from auditor.lab.facts.cp import BACKENDS, CPConfig, estimate_cp_rank
from auditor.lab.facts.effective import effective_rank
from auditor.lab.facts.exact import exact_rank
from auditor.lab.facts.shared import BOUNDS, CP, EFFECTIVE, IDS, CSVDatabase, csv_database, facts_experiment
from auditor.lab.facts.tensor import rank_bounds


def rank_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """A database CSV through the measures: bounds, the exact rank (up to 64 per side), CP, effective."""
    db = csv_database(config)
    row: dict[str, Any] = {**db.summary(), **{f"bounds_{k}": v for k, v in rank_bounds(db).to_row().items()}}
    if max(db.shape) <= 64:
        row.update(exact_rank(db).to_row())
    estimate = estimate_cp_rank(db, CPConfig(**config["cp"]), progress=True)
    row.update({f"cp_{k}": v for k, v in estimate.to_row().items()})
    return [{**row, **(effective_rank(db).to_row() if config["effective"] else {})}]


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


RANK = facts_experiment(
    "rank",
    "Measure a database CSV: triples, the paper's bound, certified bounds, exact rank, CP estimate.",
    RankConfig,
    rank_unit,
    (
        *IDS,
        *BOUNDS,
        "exact_rank",
        "exact_lower",
        "exact_upper",
        "exact_method",
        "exact_core_shape",
        *CP,
        *EFFECTIVE,
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
