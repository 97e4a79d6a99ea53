"""``audit facts budget``: the full d_qk x d_vo grid at a fixed d_model; the anti-diagonal
d_qk = d_model - d_vo + 1 is the fixed parameter budget of Paper B (2 d_model (d_qk + d_vo) per head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from auditor.lab.facts.database import DatabaseSpec
from auditor.lab.facts.model import LayerConfig
from auditor.lab.facts.shared import (
    GRID_COLUMNS,
    QUICK,
    QUICK_DB,
    REFERENCE_DB,
    SEEDED,
    Seeded,
    facts_experiment,
    train_unit,
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


BUDGET = facts_experiment(
    "budget",
    "The full d_qk x d_vo grid at a fixed d_model; its anti-diagonal is Paper B's fixed parameter budget.",
    BudgetConfig,
    train_unit,
    GRID_COLUMNS,
    presets={"quick": {"db": QUICK_DB, "d_model": 3, "db_seeds": (0,), "seeds": (0,), **QUICK}},
    **SEEDED,
)
