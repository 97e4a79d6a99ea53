"""Training fact layers with the shared engine: the :class:`FactTask` and :func:`train_layers`.

Every member of a :class:`~auditor.lab.facts.model.FactLayer` ensemble memorizes one database; members
may memorize different databases of the same shape (|K|, |Q|, |V|) (e.g. several generator seeds), with
the triple lists padded to the longest and padded rows weighted zero. The loss is cross-entropy of the
right value at the last position; full-set accuracy is argmax accuracy over all the member's triples,
which is what the engine's early stop watches (a member stops at 100%).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from auditor.core.errors import AuditError
from auditor.lab.engine import TrainConfig, TrainResult, train
from auditor.lab.facts.database import FactDatabase
from auditor.lab.facts.model import FactLayer, LayerConfig

TAUS = (0.5, 0.8, 0.9, 0.95, 0.99)  # softmax>=tau accuracies reported with every trained member


class FactTask:
    """Triple completion for an ensemble: member e memorizes ``databases[assign[e]]``.

    Args:
        databases: databases of one shape (|K|, |Q|, |V|).
        assign: (E,) index of each member's database (default: all members on database 0).
        batch_size: triples per step (sampled with replacement, shared positions across members);
            None = full batch (every step sees every triple once: one epoch per step).
    """

    def __init__(
        self, databases: Sequence[FactDatabase], assign: Sequence[int], *, batch_size: int | None = None
    ) -> None:
        shapes = {db.shape for db in databases}
        if len(shapes) != 1:
            raise AuditError(
                f"databases trained together must share one shape (|K|, |Q|, |V|), got {sorted(shapes)}"
            )
        if batch_size is not None and batch_size < 1:
            raise AuditError(f"batch_size must be >= 1 or None (full batch), got {batch_size}")
        self.shape = databases[0].shape
        n_max = max(db.num_triples for db in databases)
        E = len(assign)
        keys = torch.zeros(E, n_max, dtype=torch.long)
        queries = torch.zeros(E, n_max, dtype=torch.long)
        values = torch.zeros(E, n_max, dtype=torch.long)
        weight = torch.zeros(E, n_max, dtype=torch.float32)
        for e, i in enumerate(assign):
            t = torch.tensor(databases[i].triples)  # (N_i, 3)
            n = t.shape[0]
            keys[e, :n], queries[e, :n], values[e, :n] = t[:, 0], t[:, 1], t[:, 2]
            weight[e, :n] = 1.0
        self.keys, self.queries, self.values, self.weight = keys, queries, values, weight  # (E, N_max)
        self.count = weight.sum(1)  # (E,)
        self.batch_size = batch_size

    def batch(self, step: int, generator: torch.Generator) -> torch.Tensor | None:
        """Positions of this step's triples (B,), or None for the full batch."""
        if self.batch_size is None:
            return None
        return torch.randint(self.keys.shape[1], (self.batch_size,), generator=generator)  # (B,)

    def loss(self, model: FactLayer, batch: torch.Tensor | None) -> torch.Tensor:
        """(E,) weighted mean cross-entropy of the right value."""
        sl = slice(None) if batch is None else batch
        logits = model(self.keys[:, sl], self.queries[:, sl])  # (E, B, V)
        ce = F.cross_entropy(logits.transpose(1, 2), self.values[:, sl], reduction="none")  # (E, B)
        w = self.weight[:, sl]  # (E, B)
        return (ce * w).sum(1) / w.sum(1).clamp(min=1.0)

    def logits(self, model: FactLayer) -> torch.Tensor:
        """Logits of every member on all its triples (E, N_max, V) (padding rows included)."""
        return model(self.keys, self.queries)

    def accuracy(self, model: FactLayer) -> torch.Tensor:
        """(E,) argmax accuracy over each member's full database."""
        hit = (self.logits(model).argmax(-1) == self.values).float()  # (E, N_max)
        return (hit * self.weight).sum(1) / self.count

    def tau_accuracy(self, model: FactLayer, tau: float) -> torch.Tensor:
        """(E,) fraction of each member's triples whose right value has softmax probability >= tau."""
        prob = torch.softmax(self.logits(model).double(), -1).gather(-1, self.values[..., None]).squeeze(-1)
        return ((prob >= tau).double() * self.weight).sum(1) / self.count


@dataclass
class Trained:
    """A trained ensemble and its per-member results."""

    model: FactLayer
    task: FactTask
    result: TrainResult
    rows: list[dict[str, Any]]


def train_layers(
    databases: FactDatabase | Sequence[FactDatabase],
    configs: Sequence[LayerConfig],
    train_config: TrainConfig,
    *,
    assign: Sequence[int] | None = None,
    batch_size: int | None = None,
    taus: Sequence[float] = TAUS,
    progress: bool = False,
) -> Trained:
    """Train one ensemble (member e = ``configs[e]`` on ``databases[assign[e]]``) and measure it.

    Each row: the member's layer config, database summary, parameters, final argmax accuracy and
    facts stored (accuracy x triples), ``acc_tau{tau}`` for every tau, steps trained and the ensemble's
    wall time (shared by its members).
    """
    dbs = [databases] if isinstance(databases, FactDatabase) else list(databases)
    assign = [0] * len(configs) if assign is None else list(assign)
    if len(assign) != len(configs):
        raise AuditError(f"assign has {len(assign)} entries for {len(configs)} layer configs")
    if any(not 0 <= i < len(dbs) for i in assign):
        raise AuditError(f"assign entries must index the {len(dbs)} database(s)")
    K, Q, V = dbs[0].shape
    task = FactTask(dbs, assign, batch_size=batch_size)
    model = FactLayer(configs, K, Q, V)
    t0 = time.perf_counter()
    result = train(model, task, train_config, progress=progress)
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        tau_acc = {tau: task.tau_accuracy(model, tau) for tau in taus}
        acc = task.accuracy(model)
    params = model.member_parameters()
    rows = []
    for e, cfg in enumerate(configs):
        db = dbs[assign[e]]
        row: dict[str, Any] = {**db.summary(), **cfg.to_dict(), "parameters": params[e]}
        row["accuracy"] = float(acc[e])
        row["facts_stored"] = int(round(float(acc[e]) * db.num_triples))
        row.update({f"acc_tau{tau:g}": float(tau_acc[tau][e]) for tau in taus})
        row["steps_trained"] = int(result.steps_trained[e])
        row["early_stopped"] = bool(result.frozen[e]) if result.frozen is not None else False
        row["train_seconds"] = seconds
        row["bucket_members"] = len(configs)
        rows.append(row)
    return Trained(model=model, task=task, result=result, rows=rows)
