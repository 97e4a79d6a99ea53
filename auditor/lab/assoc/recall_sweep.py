"""Factual recall sweeps (deliverable 2 of capacity lab III): facts per parameter, and the trade-off.

Scaling (:class:`ScalingConfig`): for every model size, the largest fact table that the model learns
to at least ``threshold`` accuracy over ALL S R facts, found by bisection on k = S + R with
S = ceil(k / 2), R = floor(k / 2) (:func:`table_shape`). The authors searched S = R; letting R trail
S by one in between doubles the resolution (facts grow by ~10% per step instead of ~20%). A model
size is (d, H = attn_ratio d / d_h, d_h, m = width_ratio d), so ``attn_ratio`` = H d_h / d and ``width_ratio`` = m / d (0 = attention-only). One sweep unit is one d:
its width ratios and seeds search in lock step, each round one ensemble.

Trade-off (:class:`TradeoffConfig`): one fixed table (S = R = 32, D = 8 in the paper), a grid of head
counts H and MLP widths m at fixed d and d_h; the accuracy of every cell. One unit is one H (its m
and seeds train as one ensemble).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from auditor.errors import AuditError
from auditor.lab.assoc.capacity import Bisection, search_all
from auditor.lab.assoc.facts import DEFAULT_PROMPT_LENGTH, FactTable
from auditor.lab.assoc.recall import RecallMember, build_recall, recall_parameters
from auditor.lab.engine import TrainConfig, train
from auditor.lab.sweep import run_sweep
from auditor.provenance import provenance

FACTS_PER_PARAMETER_GUIDE = 0.15  # paper C's guide line
LM_BITS_PER_PARAMETER = 2.0  # Allen-Zhu and Li (2024), real language models


@dataclass(frozen=True)
class RecallTraining:
    """How every recall model trains: AdamW with a constant lr on fresh prompts, stopped at ``threshold``
    accuracy. Each model trains once per learning rate in ``lrs`` (as separate members of the same
    ensemble) and counts as storing its facts if any of them reaches the threshold, as the authors
    took the best of {1e-3, 3e-3, 1e-2}; the accuracy reported is that of the best run's final
    weights (a learning-rate choice, never a best-of-checkpoints)."""

    steps: int = 1000
    lrs: tuple[float, ...] = (1e-2,)
    batch_size: int = 256
    warmup_frac: float = 0.0
    threshold: float = 0.99
    eval_every: int = 50
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


def train_models(models: list[RecallMember], tr: RecallTraining) -> list[dict[str, Any]]:
    """Train every model at every learning rate of ``tr`` in ONE ensemble; per model, the best run.

    Returns one dict per model: ``accuracy`` (over all facts, best lr), ``fact_recall``, ``steps`` and
    ``best_lr`` of that run, ``accuracy_by_lr`` (JSON) and ``passed`` (any lr reached the threshold).
    """
    members = [m for m in models for _ in tr.lrs]  # model-major, lr-minor
    model, task = build_recall(members, batch_size=tr.batch_size, eval_contexts=tr.eval_contexts,
                               prompt_length=tr.prompt_length)
    result = train(model, task, tr.engine(len(members)), progress=False)
    L = len(tr.lrs)
    acc = result.accuracy.view(-1, L)  # (models, lrs)
    recall = task.fact_recall(model).view(-1, L)
    steps = result.steps.view(-1, L)
    best = acc.argmax(1)
    out = []
    for i in range(len(models)):
        b = int(best[i])
        out.append({
            "accuracy": round(float(acc[i, b]), 5), "fact_recall": round(float(recall[i, b]), 5),
            "steps": int(steps[i, b]), "best_lr": tr.lrs[b],
            "accuracy_by_lr": json.dumps({str(lr): round(float(a), 5) for lr, a in zip(tr.lrs, acc[i])}),
            "passed": bool(acc[i, b] >= tr.threshold - 1e-9), "seconds_train": round(result.seconds, 3),
        })
    return out


def _heads(d: int, attn_ratio: float, head_dim: int) -> int:
    heads = round(attn_ratio * d / head_dim)
    if heads < 1:
        raise AuditError(
            f"attn_ratio={attn_ratio} with d={d} and d_h={head_dim} gives H = {attn_ratio * d / head_dim:.2f} "
            "heads; choose a larger ratio or a smaller d_h (H must be >= 1)"
        )
    return heads


@dataclass(frozen=True)
class ScalingConfig:
    """Facts stored against parameters (see the module docstring)."""

    dims: tuple[int, ...] = (8, 12, 16, 24, 32)
    head_dim: int = 2
    attn_ratio: float = 1.0
    width_ratios: tuple[float, ...] = (0.0, 1.0)
    seeds: tuple[int, ...] = (0, 1)
    min_size: int = 4  # smallest k = S + R tried
    rel_tol: float = 0.0
    training: RecallTraining = RecallTraining()

    def __post_init__(self) -> None:
        if not self.dims or min(self.dims) < 2:
            raise AuditError(f"dims must be integers >= 2, got {self.dims}")
        if self.head_dim < 1:
            raise AuditError(f"head_dim must be >= 1, got {self.head_dim}")
        if not self.width_ratios or min(self.width_ratios) < 0:
            raise AuditError(f"width ratios m/d must be >= 0 (0 = attention-only), got {self.width_ratios}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise AuditError(f"seeds must be distinct integers, got {self.seeds}")
        for d in self.dims:
            _heads(d, self.attn_ratio, self.head_dim)

    def units(self) -> list[dict[str, Any]]:
        base = dataclasses.asdict(self)
        base.pop("dims")
        return [{**base, "d": d} for d in self.dims]


def table_shape(k: int) -> tuple[int, int]:
    """(S, R) of search size k = S + R: S = ceil(k / 2), R = floor(k / 2), so S R grows monotonically."""
    if k < 2:
        raise AuditError(f"a fact table needs S + R >= 2, got {k}")
    return (k + 1) // 2, k // 2


def _scaling_members(unit: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(width, seed index, seed) of every search in a scaling unit."""
    d = unit["d"]
    return [(round(r * d), i, s) for r in unit["width_ratios"] for i, s in enumerate(unit["seeds"])]


def run_scaling_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Sweep unit: the largest table (k = S + R) learned by each (width, seed) at one d. One row per search."""
    tr = RecallTraining(**unit["training"])
    d, dh = int(unit["d"]), int(unit["head_dim"])
    heads = _heads(d, unit["attn_ratio"], dh)
    specs = _scaling_members(unit)
    searches = []
    for width, _, _ in specs:
        guess = 2 * math.sqrt(FACTS_PER_PARAMETER_GUIDE * recall_parameters(d, heads, dh, width))  # k at the guide
        max_size = max(unit["min_size"] + 2, math.ceil(3 * guess))
        lo = max(unit["min_size"], min(max_size - 1, math.floor(0.6 * guess)))
        hi = max(lo + 1, min(max_size, math.ceil(1.0 * guess)))
        searches.append(Bisection(lo, hi, max_size=max_size, rel_tol=unit["rel_tol"]))
    probes: list[dict[str, Any]] = []

    def probe(pending: list[tuple[int, int]]) -> list[bool]:
        models = []
        for j, k in pending:
            width, _, seed = specs[j]
            table = FactTable(*table_shape(k), tr.answers_per_relation, seed=seed)
            models.append(RecallMember(d, heads, dh, width, table, seed=seed))
        outcomes = train_models(models, tr)
        for (j, k), outcome in zip(pending, outcomes):
            subjects, relations = table_shape(k)
            probes.append({"search": j, "subjects": subjects, "relations": relations, "facts": subjects * relations,
                           **{key: outcome[key] for key in ("accuracy", "fact_recall", "steps", "best_lr", "passed")}})
        return [o["passed"] for o in outcomes]

    t0 = time.perf_counter()
    rounds = search_all(searches, probe)
    seconds = time.perf_counter() - t0
    prov = provenance()
    bits_per_fact = math.log2(tr.answers_per_relation)
    rows = []
    for j, ((width, _, seed), search) in enumerate(zip(specs, searches)):
        subjects, relations = table_shape(search.capacity) if search.capacity >= 2 else (0, 0)
        params = recall_parameters(d, heads, dh, width)
        facts = subjects * relations
        rows.append({
            "d": d, "heads": heads, "head_dim": dh, "width": width, "model": "attention-only" if width == 0 else "attention+mlp",
            "params": params, "params_with_bias": params + width, "seed": seed, "subjects": subjects,
            "relations": relations, "facts": facts,
            "first_fail_facts": math.prod(table_shape(search.hi)) if search.hi <= search.max_size else None,
            "bits": facts * bits_per_fact, "facts_per_param": facts / params,
            "bits_per_param": facts * bits_per_fact / params, "rounds": rounds,
            "probes": json.dumps([p for p in probes if p["search"] == j]),
            **_training_columns(tr), "seconds_unit": round(seconds, 3), **prov,
        })
    return rows


def _training_columns(tr: RecallTraining) -> dict[str, Any]:
    return {"max_steps": tr.steps, "lrs": json.dumps(list(tr.lrs)), "optimizer": "adamw", "schedule": "constant",
            "warmup_frac": tr.warmup_frac, "eval_every": tr.eval_every, "batch_size": tr.batch_size,
            "threshold": tr.threshold, "eval_contexts": tr.eval_contexts, "T": tr.prompt_length,
            "D": tr.answers_per_relation, "dtype": "float32", "device": "cpu"}


@dataclass(frozen=True)
class TradeoffConfig:
    """Attention-versus-MLP heat map at one fact table (paper: S = R = 32, D = 8, d = 32, d_h = 8)."""

    subjects: int = 32
    relations: int = 32
    d: int = 32
    head_dim: int = 8
    heads: tuple[int, ...] = (1, 2, 4, 8, 16)
    widths: tuple[int, ...] = (0, 16, 32, 64, 128)
    seeds: tuple[int, ...] = (0,)
    training: RecallTraining = RecallTraining()

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
        RecallMember(d, heads, dh, m, FactTable(unit["subjects"], unit["relations"], tr.answers_per_relation, seed=s), seed=s)
        for m, s in cells
    ]
    outcomes = train_models(models, tr)
    prov = provenance()
    facts = unit["subjects"] * unit["relations"]
    return [
        {
            "subjects": unit["subjects"], "relations": unit["relations"], "facts": facts, "d": d, "heads": heads,
            "head_dim": dh, "width": m, "seed": s, "params": recall_parameters(d, heads, dh, m),
            "attention_params": recall_parameters(d, heads, dh, 0), "mlp_params": 2 * m * d,
            **{k: v for k, v in outcome.items() if k != "passed"}, "stored": outcome["passed"],
            **_training_columns(tr), **prov,
        }
        for (m, s), outcome in zip(cells, outcomes)
    ]


def run_scaling(config: ScalingConfig, out: str | Path, *, executor: str = "local", progress: bool = True) -> pd.DataFrame:
    """Run (or resume) the facts-per-parameter sweep into ``out`` (``results.csv``)."""
    return run_sweep(run_scaling_unit, config.units(), out, executor=executor, progress=progress, desc="recall scaling")


def run_tradeoff(config: TradeoffConfig, out: str | Path, *, executor: str = "local", progress: bool = True) -> pd.DataFrame:
    """Run (or resume) the attention-versus-MLP grid into ``out`` (``results.csv``)."""
    return run_sweep(run_tradeoff_unit, config.units(), out, executor=executor, progress=progress, desc="recall trade-off")
