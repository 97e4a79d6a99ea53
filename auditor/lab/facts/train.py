"""``audit facts train``: a grid of attention-only layers trained on a database CSV as one ensemble.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from auditor.core.errors import AuditError
from auditor.lab.engine import TrainConfig
from auditor.lab.experiment import option
from auditor.lab.facts.cp import CPConfig
from auditor.lab.facts.model import LayerConfig
from auditor.lab.facts.shared import (
    IDS,
    LAYER,
    LAYER_BOUND,
    SHOW_TRAINED,
    TRAINED,
    CSVDatabase,
    csv_database,
    facts_experiment,
    layer_columns,
    members_of,
    train_config,
)
from auditor.lab.facts.training import train_layers


def train_csv_unit(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every layer config trained on a database CSV as one ensemble; with ``layer_rank`` also L's bound."""
    trained = train_layers(csv_database(config), members_of(config), train_config(config),
                           batch_size=config["batch_size"], progress=True)
    cp = CPConfig(restarts=2, max_iter=500)
    return [
        {
            **row,
            **(layer_columns(trained.model, e, cp) if config["layer_rank"] else {}),
            "train_config": train_config(config).to_dict(),
            "dtype": "float32",
        }
        for e, row in enumerate(trained.rows)
    ]


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


TRAIN_LAYERS = facts_experiment(
    "train",
    "Train one attention-only layer per configuration on a database CSV (all batched); "
    "report the accuracies.",
    TrainLayersConfig,
    train_csv_unit,
    (*IDS, *LAYER, *TRAINED, *LAYER_BOUND, "train_config", "dtype"),
    presets={"quick": {"steps": 100}},
    show=SHOW_TRAINED,
)
