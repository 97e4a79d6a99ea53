"""Synthetic memorization data: Uniform[0, 1) queries and contexts, random labels.

One example is a context E(t) (n rows of width d), a query e(t) (width d) and a label: a class in
``0 .. classes-1`` (classification) or a vector in [0, 1)^outputs (regression). With
``shared_context`` every example uses the same context (the setting of Proposition 2); otherwise each
example draws its own. Every dataset is a pure function of its :class:`DataConfig` (seeded).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from auditor.core.errors import AuditError, did_you_mean

TASKS = ("classification", "regression")


def derived_seed(seed: int, purpose: str) -> int:
    """An independent 63-bit seed for ``purpose`` ('data', 'init', ...) derived from ``seed``."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class DataConfig:
    """A synthetic memorization dataset."""

    N: int  # examples
    context: int  # n, rows per context
    d: int = 64  # token width
    task: str = "classification"  # "classification" | "regression"
    classes: int = 100  # classification: labels uniform over 0 .. classes-1
    outputs: int = 1  # regression: label width d_o
    shared_context: bool = True  # one context E for all examples (Proposition 2) or one per example
    seed: int = 0

    def __post_init__(self) -> None:
        if self.N < 1:
            raise AuditError(f"N (examples) must be >= 1, got {self.N}")
        if self.context < 1:
            raise AuditError(f"context (n) must be >= 1, got {self.context}")
        if self.d < 1:
            raise AuditError(f"d must be >= 1, got {self.d}")
        if self.task not in TASKS:
            raise did_you_mean("task", self.task, TASKS)
        if self.task == "classification" and self.classes < 2:
            raise AuditError(f"classification needs classes >= 2, got {self.classes}")
        if self.task == "regression" and self.outputs < 1:
            raise AuditError(f"regression needs outputs >= 1, got {self.outputs}")

    @property
    def label_width(self) -> int:
        """Width of the model output: classes (logits) or outputs (regression)."""
        return self.classes if self.task == "classification" else self.outputs


@dataclass
class MemorizeData:
    """A dataset in memory. ``contexts`` is (1, n, d) when shared, else (N, n, d)."""

    contexts: torch.Tensor  # (N, n, d) or (1, n, d)
    queries: torch.Tensor  # (N, d)
    labels: torch.Tensor  # (N,) long | (N, d_o) float
    task: str = "classification"
    classes: int = 0  # 0 for regression

    def __post_init__(self) -> None:
        N = self.queries.shape[0]
        if self.contexts.dim() != 3 or self.contexts.shape[0] not in (1, N):
            raise AuditError(
                f"contexts must be (N, n, d) or (1, n, d) for N={N}, got {tuple(self.contexts.shape)}"
            )
        if self.contexts.shape[2] != self.queries.shape[1]:
            raise AuditError("contexts and queries must have the same width d")
        if self.labels.shape[0] != N:
            raise AuditError(f"{self.labels.shape[0]} labels for {N} examples")

    @property
    def N(self) -> int:
        return self.queries.shape[0]

    @property
    def n(self) -> int:
        return self.contexts.shape[1]

    @property
    def d(self) -> int:
        return self.queries.shape[1]

    @property
    def shared(self) -> bool:
        return self.contexts.shape[0] == 1

    def context_rows(self) -> torch.Tensor:
        """(N, n, d) contexts, expanded (a view) when shared."""
        return self.contexts.expand(self.N, -1, -1)


def make_data(config: DataConfig) -> MemorizeData:
    """Draw the dataset of ``config``: context(s), then queries, then labels, from one seeded generator."""
    g = torch.Generator().manual_seed(derived_seed(config.seed, "data"))
    rows = 1 if config.shared_context else config.N
    contexts = torch.rand(rows, config.context, config.d, generator=g)  # (1 | N, n, d)
    queries = torch.rand(config.N, config.d, generator=g)  # (N, d)
    if config.task == "classification":
        labels = torch.randint(config.classes, (config.N,), generator=g)  # (N,)
        return MemorizeData(contexts, queries, labels, "classification", config.classes)
    labels = torch.rand(config.N, config.outputs, generator=g)  # (N, d_o)
    return MemorizeData(contexts, queries, labels, "regression", 0)


def random_labels(N: int, classes: int, seed: int) -> torch.Tensor:
    """(N,) uniform random classes for real tokens (the capacity pipeline)."""
    if classes < 2:
        raise AuditError(f"classes must be >= 2, got {classes}")
    g = torch.Generator().manual_seed(derived_seed(seed, "labels"))
    return torch.randint(classes, (N,), generator=g)
