"""Linear and MLP associative memories (paper C) as batched ensembles.

An associative memory stores N pairs x -> f(x) = x. Item x has a random unit-norm input embedding
e_x in R^d and a random unit-norm output embedding u_x in R^d; the memory maps e_x to a vector F(e_x)
and predicts argmax_y u_y^T F(e_x). Two memories:

- linear: F(e) = W e with W in R^{d x d} (d^2 trainable parameters);
- MLP: F(e) = W_2 relu(W_1 e + b_1) with W_1 in R^{m x d}, W_2 in R^{d x m} (counted as m d, the
  paper's axis; 2 m d + m trainable numbers).

Many memories train together as one :class:`~auditor.lab.engine.Ensemble`: members share d (and m for
the MLP) and differ in the number of items N and the seed. Members with fewer items than the largest are
padded: padded items carry no loss weight and padded outputs get logit -inf, so every member sees
exactly its own N-item problem. Accuracy is measured over ALL of a member's N items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from auditor.core.errors import AuditError, did_you_mean
from auditor.lab.engine import Ensemble

MEMORY_KINDS = ("linear", "mlp")


def unit_sphere(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """n vectors drawn uniformly on the unit sphere of R^d: (n, d), float32."""
    x = torch.randn(n, d, generator=generator, dtype=torch.float64)
    return (x / x.norm(dim=1, keepdim=True)).float()


def memory_parameters(kind: str, d: int, m: int = 0) -> int:
    """The parameter count on the paper's axis: d^2 (linear) or m d (MLP)."""
    if kind == "linear":
        return d * d
    if kind == "mlp":
        return m * d
    raise did_you_mean("memory kind", kind, MEMORY_KINDS)


class LinearMemory(Ensemble):
    """E linear memories F(e) = W e; W: (E, d, d), initialised N(0, 1/d) (LeCun normal) per member."""

    def __init__(self, num_members: int, d: int, generators: Sequence[torch.Generator]) -> None:
        super().__init__(num_members)
        if len(generators) != num_members:
            raise AuditError(f"need one generator per member: {len(generators)} for {num_members}")
        self.d = d
        w = torch.stack([torch.randn(d, d, generator=g) / math.sqrt(d) for g in generators])  # (E, d, d)
        self.weight = nn.Parameter(w)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs: (E, N, d) -> F(inputs): (E, N, d)."""
        return torch.einsum("eij,enj->eni", self.weight, inputs)  # (E, N, d)


class MLPMemory(Ensemble):
    """E ReLU memories F(e) = W_2 relu(W_1 e + b_1) of width m.

    W_1: (E, m, d) ~ N(0, 1/d), b_1: (E, m) = 0, W_2: (E, d, m) ~ N(0, 1/m) (LeCun normal, as the
    authors' Flax Dense layers).
    """

    def __init__(self, num_members: int, d: int, m: int, generators: Sequence[torch.Generator]) -> None:
        super().__init__(num_members)
        if len(generators) != num_members:
            raise AuditError(f"need one generator per member: {len(generators)} for {num_members}")
        if m < 1:
            raise AuditError(f"MLP width m must be >= 1, got {m}")
        self.d, self.m = d, m
        w1 = torch.stack([torch.randn(m, d, generator=g) / math.sqrt(d) for g in generators])  # (E, m, d)
        w2 = torch.stack([torch.randn(d, m, generator=g) / math.sqrt(m) for g in generators])  # (E, d, m)
        self.w1 = nn.Parameter(w1)
        self.b1 = nn.Parameter(torch.zeros(num_members, m))
        self.w2 = nn.Parameter(w2)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs: (E, N, d) -> F(inputs): (E, N, d)."""
        hidden = torch.relu(torch.einsum("emd,end->enm", self.w1, inputs) + self.b1[:, None, :])  # (E, N, m)
        return torch.einsum("edm,enm->end", self.w2, hidden)  # (E, N, d)


@dataclass(frozen=True)
class MemoryMember:
    """One memory to train: its item count and the seed of its embeddings and initial weights."""

    n_items: int
    seed: int

    def __post_init__(self) -> None:
        if self.n_items < 1:
            raise AuditError(f"a memory needs at least one item, got N={self.n_items}")


class MemoryTask:
    """The full-batch task of storing x -> x for every member (the engine's ``Task``).

    A member's embeddings and initial weights depend only on its own (N, seed), never on the other
    members of the ensemble (see :func:`build_memory`); its rows past N are zero padding.

    Tensors: ``inputs`` (E, N_max, d), ``outputs`` (E, N_max, d), ``valid`` (E, N_max) bool.
    """

    def __init__(self, inputs: torch.Tensor, outputs: torch.Tensor, n_items: torch.Tensor) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.n_items = n_items
        num_members, n_max = inputs.shape[:2]
        self.valid = torch.arange(n_max)[None, :] < n_items[:, None]  # (E, N_max)
        # padded outputs can never be predicted: additive -inf on their logits
        self.output_bias = torch.zeros(num_members, 1, n_max).masked_fill(
            ~self.valid[:, None, :], float("-inf")
        )
        # f(x) = x; padded inputs point at output 0 (finite loss) and carry weight 0
        self.targets = torch.where(self.valid, torch.arange(n_max)[None, :], 0)  # (E, N_max)
        self.weights = self.valid.float() / n_items[:, None].float()  # (E, N_max): mean over own items

    def logits(self, model: Ensemble) -> torch.Tensor:
        """Scores u_y^T F(e_x) with padded outputs at -inf: (E, N_max inputs, N_max outputs)."""
        scores = torch.einsum("end,eyd->eny", model(self.inputs), self.outputs)  # (E, N, N)
        return scores + self.output_bias

    def batch(self, step: int, generator: torch.Generator) -> None:
        """Full batch: every step sees every item (no randomness needed)."""
        return None

    def loss(self, model: Ensemble, batch: None) -> torch.Tensor:
        """(E,) mean cross-entropy over each member's own N items."""
        logits = self.logits(model)  # (E, N, N)
        nll = nn.functional.cross_entropy(logits.flatten(0, 1), self.targets.flatten(), reduction="none")
        return (nll.view_as(self.weights) * self.weights).sum(1)  # (E,)

    def correct(self, model: Ensemble) -> torch.Tensor:
        """(E, N_max) bool: item x is recalled (argmax over the member's outputs is x); padded: False."""
        with torch.no_grad():
            pred = self.logits(model).argmax(-1)  # (E, N)
        return (pred == self.targets) & self.valid

    def accuracy(self, model: Ensemble) -> torch.Tensor:
        """(E,) fraction of ALL N items recalled."""
        return self.correct(model).sum(1).double() / self.n_items.double()


def build_memory(
    kind: str, d: int, members: Sequence[MemoryMember], *, m: int = 0
) -> tuple[Ensemble, MemoryTask]:
    """The ensemble of memories and its task, one member per ``members`` entry.

    Args:
        kind: ``linear`` or ``mlp``.
        d: embedding dimension shared by every member.
        members: item count and seed of each member; the N are padded to their maximum.
        m: MLP width (``mlp`` only).

    Returns:
        (model, task) ready for :func:`auditor.lab.engine.train`.
    """
    if kind not in MEMORY_KINDS:
        raise did_you_mean("memory kind", kind, MEMORY_KINDS)
    if d < 1:
        raise AuditError(f"embedding dimension d must be >= 1, got {d}")
    if not members:
        raise AuditError("build_memory needs at least one member")
    n_max = max(mem.n_items for mem in members)
    gens = [torch.Generator().manual_seed(mem.seed) for mem in members]
    inputs = torch.zeros(len(members), n_max, d)  # (E, N_max, d)
    outputs = torch.zeros(len(members), n_max, d)  # (E, N_max, d)
    for i, (mem, g) in enumerate(zip(members, gens)):  # per member: inputs, outputs, then weights
        inputs[i, : mem.n_items] = unit_sphere(mem.n_items, d, g)
        outputs[i, : mem.n_items] = unit_sphere(mem.n_items, d, g)
    n_items = torch.tensor([mem.n_items for mem in members], dtype=torch.long)
    model: Ensemble
    if kind == "linear":
        model = LinearMemory(len(members), d, gens)
    else:
        model = MLPMemory(len(members), d, m, gens)
    return model, MemoryTask(inputs, outputs, n_items)


def construction_weights(inputs: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """The paper's closed-form linear memory W = sum_x u_x e_x^T for every member.

    inputs, outputs: (E, N, d) (padded rows must be zero) -> W: (E, d, d).
    """
    return torch.einsum("end,enk->edk", outputs, inputs)  # (E, d, d)
