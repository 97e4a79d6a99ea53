"""How every model of the recall room's sweeps trains (:class:`RecallTraining`), the outcome of one run
at a step budget (:func:`outcome_at`), one ensemble over the models and their learning rates
(:func:`train_models`) and the training columns that every row carries: what ``recall scaling`` and
``recall tradeoff`` share.

Every row says whether it is ``converged``: a run that ended below the threshold counts as converged
only if its accuracy had stopped rising (``PLATEAU_GAIN`` over the last ``PLATEAU_WINDOW`` of its
budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from auditor.core.errors import AuditError
from auditor.lab.common.search.convergence import PLATEAU_GAIN, accuracy_at, plateau_gain
from auditor.lab.engine import TrainConfig, train
from auditor.lab.experiment import option
from auditor.lab.recall.model import RecallMember, build_recall
from auditor.lab.recall.task import DEFAULT_PROMPT_LENGTH


@dataclass(frozen=True)
class RecallTraining:
    """How every recall model trains: AdamW with a constant lr on fresh prompts, stopped at ``threshold``
    accuracy. Each model trains once per learning rate in ``lrs`` (as separate members of the same
    ensemble) and counts as storing its facts if any of them reaches the threshold, as the authors
    took the best of {1e-3, 3e-3, 1e-2}; the accuracy reported is that of the best run's final
    weights (a learning-rate choice, never a best-of-checkpoints)."""

    steps: int = option(1000, "Max training steps per model.", default_help="per scale")
    lrs: tuple[float, ...] = option(
        (1e-2,),
        "Learning rates; each model trains at every one and keeps its best run.",
        flag="--lr",
        default_help="per scale",
    )
    batch_size: int = 256
    warmup_frac: float = 0.0
    threshold: float = 0.99
    eval_every: int = option(50, "Steps between evaluations over all facts (and early-stop checks).")
    eval_contexts: int = 4
    prompt_length: int = DEFAULT_PROMPT_LENGTH
    answers_per_relation: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "lrs", tuple(float(lr) for lr in self.lrs))  # JSON units hand back lists
        if self.batch_size < 1 or self.eval_contexts < 1 or self.answers_per_relation < 1:
            raise AuditError("batch_size, eval_contexts and answers_per_relation (D) must be >= 1")
        if self.prompt_length < 3:
            raise AuditError(f"prompt_length T must be >= 3, got {self.prompt_length}")
        if not self.lrs or len(set(self.lrs)) != len(self.lrs):
            raise AuditError(f"lrs must be distinct learning rates, got {self.lrs}")
        self.engine(len(self.lrs))  # the engine validates steps, lrs, warm-up, threshold

    def engine(self, num_members: int) -> TrainConfig:
        """Engine settings for ``num_members`` = models x len(lrs) members, model-major."""
        member_lr = tuple(float(lr) for lr in self.lrs) * (num_members // len(self.lrs))
        return TrainConfig(
            steps=self.steps,
            lr=max(self.lrs),
            member_lr=member_lr,
            optimizer="adamw",
            warmup_frac=self.warmup_frac,
            schedule="constant",
            early_stop=True,
            target_accuracy=self.threshold,
            eval_every=self.eval_every,
        )


def outcome_at(history: pd.DataFrame, budget: int, threshold: float) -> dict[str, Any]:
    """What a run would have reported had it been given ``budget`` steps: ``accuracy``, ``passed``
    (some evaluation up to ``budget`` reached ``threshold``: the engine stops there, so a run with that
    budget ends identically) and ``converged`` (passed, or plateaued: see ``PLATEAU_GAIN``)."""
    seen = history[history["step"] <= budget]
    hits = seen.loc[seen["accuracy"] >= threshold - 1e-12, "step"]
    accuracy = accuracy_at(history, budget)
    gain = plateau_gain(history, budget)
    return {
        "accuracy": accuracy,
        "passed": not hits.empty,
        "converged": not hits.empty or gain < PLATEAU_GAIN,
        "steps_trained": int(hits.iloc[0] if not hits.empty else seen["step"].iloc[-1]),
    }


def train_models(models: list[RecallMember], tr: RecallTraining,
                 budgets: tuple[int, ...] = ()) -> list[dict[int, dict[str, Any]]] | list[dict[str, Any]]:
    """Train every model at every learning rate of ``tr`` in ONE ensemble; per model, the best run.

    Returns one dict per model: ``accuracy`` (over all facts, best lr), ``fact_recall``, ``steps_trained`` and
    ``best_lr`` of that run, ``accuracy_by_lr``, ``passed`` (any lr reached the threshold) and
    ``converged`` (the best run passed or had stopped improving, see ``PLATEAU_GAIN``). With
    ``budgets`` (step counts, each reached by an evaluation), one such dict per budget instead, keyed by
    the budget: what runs stopped at that budget would have reported (``fact_recall`` only at ``steps``).
    """
    members = [m for m in models for _ in tr.lrs]  # model-major, lr-minor
    model, task = build_recall(members, batch_size=tr.batch_size, eval_contexts=tr.eval_contexts,
                               prompt_length=tr.prompt_length)
    result = train(model, task, tr.engine(len(members)), progress=False)
    L = len(tr.lrs)
    recall = task.fact_recall(model).view(-1, L)
    runs = dict(tuple(result.history.groupby("member")))
    out = []
    for i in range(len(models)):
        per_budget = {}
        for budget in budgets or (tr.steps,):
            by_lr = [outcome_at(runs[i * L + j], budget, tr.threshold) for j in range(L)]
            b = max(range(L), key=lambda j: (by_lr[j]["passed"], by_lr[j]["accuracy"]))
            per_budget[budget] = {
                "accuracy": round(by_lr[b]["accuracy"], 5),
                "fact_recall": round(float(recall[i, b]), 5) if budget == tr.steps else None,
                "steps_trained": by_lr[b]["steps_trained"], "best_lr": tr.lrs[b],
                "accuracy_by_lr": {str(lr): round(o["accuracy"], 5) for lr, o in zip(tr.lrs, by_lr)},
                "passed": by_lr[b]["passed"], "converged": by_lr[b]["converged"],
                "train_seconds": round(result.seconds, 3),
            }
        out.append(per_budget if budgets else per_budget[tr.steps])
    return out


def training_columns(tr: RecallTraining) -> dict[str, Any]:
    return {"steps": tr.steps, "lrs": list(tr.lrs), "optimizer": "adamw", "schedule": "constant",
            "warmup_frac": tr.warmup_frac, "eval_every": tr.eval_every, "batch_size": tr.batch_size,
            "threshold": tr.threshold, "eval_contexts": tr.eval_contexts, "prompt_length": tr.prompt_length,
            "answers_per_relation": tr.answers_per_relation, "dtype": "float32"}


TRAINING_COLUMNS = ("steps", "lrs", "optimizer", "schedule", "warmup_frac", "eval_every", "batch_size",
                    "threshold", "eval_contexts", "prompt_length", "answers_per_relation", "dtype")
