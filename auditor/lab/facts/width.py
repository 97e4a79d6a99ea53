"""``audit facts width``: accuracy against d_model and d_vo (d_qk = d_model, H = 1), one unit per database
seed (its unit function, :func:`~.shared.train_unit`, also runs ``facts budget``).
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


WIDTH = facts_experiment(
    "width",
    "Accuracy against d_model and d_vo (d_qk = d_model, one head), per database seed.",
    WidthConfig,
    train_unit,
    GRID_COLUMNS,
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
    **SEEDED,
)
