"""``audit recall tradeoff`` (deliverable 2 of capacity lab III): attention against MLP.

One fixed table (S = R = 32, D = 8 in the paper), a grid of head counts H and MLP widths m at fixed d
and d_h; the accuracy of every cell. One unit is one H (its m and seeds train as one ensemble). The
sweep is in ``tradeoff/``, its rows also in ``tradeoff.csv``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from auditor.core.atomic import write_text_atomic
from auditor.core.errors import AuditError
from auditor.lab.experiment import Experiment, option
from auditor.lab.recall.model import RecallMember, recall_parameters
from auditor.lab.recall.task import FactTable
from auditor.lab.recall.training import TRAINING_COLUMNS, RecallTraining, train_models, training_columns
from auditor.lab.sweep import field_defaults, write_csv


@dataclass(frozen=True)
class TradeoffConfig:
    """Attention-versus-MLP heat map at one fact table (paper: S = R = 32, D = 8, d = 32, d_h = 8)."""

    subjects: int = 32
    relations: int = 32
    d: int = 32
    head_dim: int = 8
    heads: tuple[int, ...] = option((1, 2, 4, 8, 16), "Head counts H of the grid, e.g. 1,2,4:32:4.",
                                    parse="ints", default_help="per scale")
    widths: tuple[int, ...] = option((0, 16, 32, 64, 128), "MLP widths m of the grid (0 = attention-only), "
                                     "e.g. 1,8:64:8.", parse="ints", default_help="per scale")
    seeds: tuple[int, ...] = option((0,), "Seeds of the fact table and models.", default_help="per scale")
    training: RecallTraining = field(default=RecallTraining(), metadata={"nested": True})

    def __post_init__(self) -> None:
        if self.subjects < 1 or self.relations < 1 or self.d < 1 or self.head_dim < 1:
            raise AuditError("S, R, d and d_h must all be >= 1")
        if not self.heads or min(self.heads) < 1:
            raise AuditError(f"head counts must be >= 1, got {self.heads}")
        if not self.widths or min(self.widths) < 0:
            raise AuditError(f"MLP widths must be >= 0 (0 = attention-only), got {self.widths}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise AuditError(f"seeds must be distinct integers, got {self.seeds}")

    def units(self) -> list[dict[str, Any]]:
        base = dataclasses.asdict(self)
        base.pop("heads")
        return [{**base, "H": h} for h in self.heads]


def run_tradeoff_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Sweep unit: every (m, seed) at one head count H, trained as one ensemble. One row per cell."""
    tr = RecallTraining(**unit["training"])
    d, dh, heads = int(unit["d"]), int(unit["head_dim"]), int(unit["H"])
    cells = [(m, s) for m in unit["widths"] for s in unit["seeds"]]
    models = [
        RecallMember(
            d,
            heads,
            dh,
            m,
            FactTable(unit["subjects"], unit["relations"], tr.answers_per_relation, seed=s),
            seed=s,
        )
        for m, s in cells
    ]
    outcomes = train_models(models, tr)
    facts = unit["subjects"] * unit["relations"]
    return [
        {
            "subjects": unit["subjects"],
            "relations": unit["relations"],
            "facts": facts,
            "d": d,
            "heads": heads,
            "head_dim": dh,
            "width": m,
            "seed": s,
            "parameters": recall_parameters(d, heads, dh, m),
            "attention_parameters": recall_parameters(d, heads, dh, 0),
            "mlp_parameters": 2 * m * d,
            **{k: v for k, v in outcome.items() if k not in ("passed", "converged")},
            "stored": outcome["passed"],
            "converged": outcome["converged"],
            **training_columns(tr),
        }
        for (m, s), outcome in zip(cells, outcomes)
    ]


TRADEOFF_COLUMNS = (
    "subjects",
    "relations",
    "facts",
    "d",
    "heads",
    "head_dim",
    "width",
    "seed",
    "parameters",
    "attention_parameters",
    "mlp_parameters",
    "accuracy",
    "fact_recall",
    "steps_trained",
    "best_lr",
    "accuracy_by_lr",
    "train_seconds",
    "stored",
    "converged",
    *TRAINING_COLUMNS,
)


# a unit holds its config's fields (the training nested): its key leaves their defaults out
TRADEOFF_KEYS = {**field_defaults(TradeoffConfig), "training": RecallTraining}


# Named scales. The paper: H in {1, 2, 4, 6, ..., 32}, m in {1, 8, 16, ..., 128}, 16384 steps of 1024,
# lr 1e-2.
TRADEOFF_PRESETS = {
    "quick": {"heads": (1, 2), "widths": (0, 16), "seeds": (0,), "training": {"steps": 50, "batch_size": 256,
                                                                             "lrs": (1e-2,)}},
    "reference": {"heads": (1, 2, 4, 8, 16), "widths": (0, 16, 32, 64, 128), "seeds": (0, 1, 2),
                  "training": {"steps": 1000, "batch_size": 256, "lrs": (1e-2, 3e-2)}},
    "paper": {"heads": (1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32),
              "widths": (1, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128), "seeds": (0, 1, 2),
              "training": {"steps": 16384, "batch_size": 1024, "lrs": (1e-2,)}},
}


def _tradeoff_report(frame: pd.DataFrame, out: Path, config: TradeoffConfig) -> str:
    from auditor.lab.common.search.summary import tradeoff_markdown

    write_csv(frame, out / "tradeoff.csv")
    text = "## Attention versus MLP\n\n" + tradeoff_markdown(frame)
    write_text_atomic(out / "tradeoff.md", text + "\n")
    return text


def _plot(name: str, file: str):
    def draw(frame: pd.DataFrame, out: Path, config: Any) -> list[Path]:
        from auditor.lab.common.search import plots

        return [getattr(plots, name)(frame, out / file)]

    return draw


TRADEOFF = Experiment(
    name="recall tradeoff",
    help="Accuracy over a grid of heads H and MLP widths m at S = R = 32, d = 32, d_h = 8.",
    config=TradeoffConfig, units=lambda config, out: config.units(), run_unit=run_tradeoff_unit,
    columns=TRADEOFF_COLUMNS, plots=_plot("plot_tradeoff", "tradeoff.png"), report=_tradeoff_report,
    presets=TRADEOFF_PRESETS, folder=lambda unit: "tradeoff", key_defaults=TRADEOFF_KEYS,
)
