"""Effective rank of a database: the least CP rank of a logit tensor whose argmax is right on every fact.

A rank-r tensor T = sum_i a_i (x) b_i (x) c_i predicts the fact (k, q, v) when argmax_v' T[k, q, v'] = v
(a strict maximum; ties count as wrong). Absent (k, q) pairs are unconstrained. The effective rank is
at most the CP rank (an exact decomposition predicts every fact) and can be far lower.

* Rank 1 is decided exactly: T[k, q, :] = a_k b_q c, so its argmax is argmax c where a_k b_q > 0 and
  argmin c where a_k b_q < 0. A database has effective rank 1 iff it uses at most two values and the
  pairs can be signed so that the value is one where s_k t_q = +1 and the other where it is -1 (a
  two-colouring of the bipartite key-query graph, checked by graph search).
* Ranks >= 2 are searched: rank-r logit tensors are fitted by cross-entropy on the present fibres, all
  candidate (rank, restart) pairs as members of one batched ensemble trained by the lab engine (early
  stop at 100% argmax accuracy). A rank that reaches 100% is a witness (checked again on the fitted
  factors); the search returns the least such rank, an upper bound on the effective rank.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from auditor.core.errors import AuditError
from auditor.lab.engine import Ensemble, TrainConfig, train
from auditor.lab.facts.database import FactDatabase
from auditor.lab.facts.tensor import rank_bounds


def rank_one_signs(db: FactDatabase) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A rank-1 witness (a, b, c) whose strict argmax predicts every fact, or None when none exists."""
    K, Q, V = db.shape
    used = np.unique(db.triples[:, 2])
    if used.size == 0 or used.size > 2:
        return None
    sign = np.zeros(K + Q, dtype=np.int64)  # keys 0..K-1, then queries K..K+Q-1
    adj: list[list[tuple[int, int]]] = [[] for _ in range(K + Q)]
    for k, q, v in db.triples:
        parity = 1 if v == used[0] else -1  # s_k t_q must equal this
        adj[k].append((K + q, parity))
        adj[K + q].append((k, parity))
    for start in range(K + Q):
        if sign[start]:
            continue
        sign[start] = 1
        todo = deque([start])
        while todo:
            node = todo.popleft()
            for other, parity in adj[node]:
                want = sign[node] * parity
                if sign[other] == 0:
                    sign[other] = want
                    todo.append(other)
                elif sign[other] != want:
                    return None
    c = np.zeros(V)
    c[used[0]] = 1.0  # the unique maximum: predicted where s_k t_q = +1
    if used.size == 2:
        c[used[1]] = -1.0  # the unique minimum: predicted where s_k t_q = -1
    return sign[:K].astype(float), sign[K:].astype(float), c


class CPLogits(Ensemble):
    """E rank-r logit tensors T_e = sum_i A_e[:, i] (x) B_e[:, i] (x) C_e[:, i] (ranks padded with a mask)."""

    def __init__(self, ranks: Sequence[int], shape: tuple[int, int, int], seeds: Sequence[int]) -> None:
        super().__init__(len(ranks))
        K, Q, V = shape
        R = max(ranks)
        self.ranks = tuple(ranks)
        self.A = nn.Parameter(torch.zeros(len(ranks), K, R))  # (E, K, R)
        self.B = nn.Parameter(torch.zeros(len(ranks), Q, R))  # (E, Q, R)
        self.C = nn.Parameter(torch.zeros(len(ranks), V, R))  # (E, V, R)
        self.register_buffer(
            "mask", (torch.arange(R)[None] < torch.tensor(list(ranks))[:, None]).float()
        )  # (E, R)
        with torch.no_grad():
            for e, (r, seed) in enumerate(zip(ranks, seeds)):
                g = torch.Generator().manual_seed(int(seed))
                for p, n in ((self.A, K), (self.B, Q), (self.C, V)):
                    p[e, :, :r] = torch.randn(n, r, generator=g) * r ** (-1 / 6)  # logits ~ N(0, 1)

    def forward(self, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """keys, queries (E, N) -> logits (E, N, V)."""
        a = torch.gather(self.A, 1, keys[..., None].expand(-1, -1, self.A.shape[2]))  # (E, N, R)
        b = torch.gather(self.B, 1, queries[..., None].expand(-1, -1, self.B.shape[2]))  # (E, N, R)
        return torch.einsum("enr,evr->env", a * b * self.mask[:, None, :], self.C)  # (E, N, V)


class _FibreTask:
    """Full-batch cross-entropy on every present fibre (shared by all members)."""

    def __init__(self, db: FactDatabase, members: int) -> None:
        t = torch.tensor(db.triples)  # (N, 3)
        self.keys = t[:, 0][None].expand(members, -1)  # (E, N)
        self.queries = t[:, 1][None].expand(members, -1)  # (E, N)
        self.values = t[:, 2][None].expand(members, -1)  # (E, N)

    def batch(self, step: int, generator: torch.Generator) -> None:
        return None

    def loss(self, model: CPLogits, batch: None) -> torch.Tensor:
        logits = model(self.keys, self.queries)  # (E, N, V)
        return F.cross_entropy(logits.transpose(1, 2), self.values, reduction="none").mean(1)  # (E,)

    def accuracy(self, model: CPLogits) -> torch.Tensor:
        return strict_argmax_hits(model(self.keys, self.queries), self.values).float().mean(1)  # (E,)


def strict_argmax_hits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(..., N) bool: the target's logit is strictly above every other value's. logits (..., N, V)."""
    right = logits.gather(-1, targets[..., None])  # (..., N, 1)
    others = logits.scatter(-1, targets[..., None], float("-inf"))  # (..., N, V)
    return right.squeeze(-1) > others.amax(-1)


@dataclass
class EffectiveRank:
    """The effective-rank search result."""

    rank: int | None  # least rank with a witness (None: no witness up to `ceiling`)
    lower: int  # certified lower bound (1, or 2 when rank 1 is impossible)
    ceiling: int  # largest rank tried; the CP rank's certified upper bound caps the search
    exact: bool  # rank == lower (so the search result is the effective rank itself)
    seconds: float
    accuracy: dict[int, float] = field(default_factory=dict)  # best accuracy reached per tried rank

    def to_row(self) -> dict[str, Any]:
        return {
            "effective_rank": self.rank,
            "effective_lower": self.lower,
            "effective_exact": self.exact,
            "effective_seconds": self.seconds,
            "effective_tried": ";".join(f"{r}:{a:.4f}" for r, a in sorted(self.accuracy.items())),
        }


def effective_rank(
    db: FactDatabase,
    *,
    restarts: int = 3,
    max_rank: int | None = None,
    batch_ranks: int = 6,
    train_config: TrainConfig | None = None,
    seed: int = 0,
    progress: bool = False,
) -> EffectiveRank:
    """Search the least rank whose fitted logit tensor predicts every fact of ``db`` (see module doc)."""
    if restarts < 1 or batch_ranks < 1:
        raise AuditError("restarts and batch_ranks must be >= 1")
    t0 = time.perf_counter()
    if db.num_triples == 0:
        return EffectiveRank(0, 0, 0, True, 0.0)
    if rank_one_signs(db) is not None:
        return EffectiveRank(1, 1, 1, True, time.perf_counter() - t0, {1: 1.0})
    cfg = train_config or TrainConfig(
        steps=2000, lr=0.05, eval_every=25, warmup_frac=0.0, schedule="constant", seed=seed
    )
    ceiling = rank_bounds(db).upper if max_rank is None else max_rank
    tried: dict[int, float] = {}
    lo, hi, round_ = 2, ceiling, 0  # ranks below lo failed; hi is the least witness found so far
    found = False
    while lo <= hi and not (found and lo == hi):
        last = hi - 1 if found else hi
        if found:
            probe = sorted({int(round(x)) for x in np.linspace(lo, last, min(batch_ranks, last - lo + 1))})
        elif round_ == 0:
            probe = [lo]  # the certified lower bound alone first: when it passes, the answer is exact
        else:
            probe = sorted({min(lo + j * 2 ** (round_ - 1), last) for j in range(batch_ranks)})
        round_ += 1
        members = [(r, s) for r in probe for s in range(restarts)]
        seeds = [int(np.random.SeedSequence([seed, r, s]).generate_state(1)[0]) for r, s in members]
        model = CPLogits([r for r, _ in members], db.shape, seeds)
        train(model, _FibreTask(db, len(members)), cfg, progress=progress)
        with torch.no_grad():
            acc = _FibreTask(db, len(members)).accuracy(model)  # (E,)
        for (r, _), a in zip(members, acc.tolist()):
            tried[r] = max(tried.get(r, 0.0), a)
        passing = [r for r in probe if tried[r] >= 1.0]
        if passing:
            hi, found = min(passing), True
        failing = [r for r in probe if tried[r] < 1.0 and r <= last]
        if failing:
            lo = max(failing) + 1
        if not passing and lo > last:
            break
    rank = hi if found else None
    return EffectiveRank(rank, 2, ceiling, rank == 2, time.perf_counter() - t0, tried)
