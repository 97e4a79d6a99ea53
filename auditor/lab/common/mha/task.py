"""The memorization task of the engine: per-member datasets padded into one batch.

Members of an ensemble may differ in N (examples) and n (context rows). Distinct datasets are stored
once, padded to the largest N and n: padded context rows get -inf attention logits, padded examples are
never drawn and never counted. Minibatches draw B uniform numbers u from the engine's generator (shared
by all members) and member e takes examples ``floor(u * N_e)`` (sampling with replacement); a member
whose N_e <= B uses its whole set each step (full batch). A member therefore sees exactly the same
batches whether it trains alone or with others.

Memorized examples: correct argmax (classification) or every output within ``error_tolerance`` of its label
(regression).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from auditor.core.errors import AuditError
from auditor.lab.common.mha.data import MemorizeData
from auditor.lab.common.mha.model import MHAEnsemble


@dataclass
class Batch:
    """Example indices (E, B) into each member's dataset and which of them are real (E, B).

    ``inputs`` caches the gathered (queries, contexts, labels) of a batch that is reused every step
    (every member full-batch).
    """

    index: torch.Tensor
    valid: torch.Tensor
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


class MemorizeTask:
    """The engine's :class:`~auditor.lab.engine.Task` for an :class:`MHAEnsemble`.

    Args:
        datasets: one :class:`MemorizeData` per member (the same object may serve several members; it
            is stored once). All share the task, the width d and whether the context is shared.
        batch_size: B; members with N <= B train full-batch.
        error_tolerance: regression only: an example is memorized when every output is within it.
        device: where the padded tensors live (the model's device).
        eval_chunk: examples per forward pass in :meth:`accuracy`.
    """

    def __init__(
        self,
        datasets: Sequence[MemorizeData],
        batch_size: int = 256,
        *,
        error_tolerance: float = 0.05,
        device: str | torch.device = "cpu",
        eval_chunk: int = 1024,
    ) -> None:
        if batch_size < 1:
            raise AuditError(f"batch_size must be >= 1, got {batch_size}")
        first = datasets[0]
        if any((ds.task, ds.d, ds.shared) != (first.task, first.d, first.shared) for ds in datasets):
            raise AuditError("members of one task must share the task, d and shared/non-shared contexts")
        if first.task == "regression" and not error_tolerance > 0:
            raise AuditError(f"regression error_tolerance must be > 0, got {error_tolerance}")
        self.task, self.shared, self.batch_size = first.task, first.shared, batch_size
        self.error_tolerance, self.eval_chunk = error_tolerance, eval_chunk
        unique: list[MemorizeData] = []
        slot: list[int] = []
        for ds in datasets:
            found = next((j for j, u in enumerate(unique) if u is ds), None)
            if found is None:
                unique.append(ds)
                found = len(unique) - 1
            slot.append(found)
        G, N_max, n_max, d = len(unique), max(u.N for u in unique), max(u.n for u in unique), first.d
        self.member_data = torch.tensor(slot, device=device)  # (E,)
        self.N = torch.tensor([unique[j].N for j in slot], device=device)  # (E,)
        self.n = torch.tensor([unique[j].n for j in slot], device=device)  # (E,)
        self.queries = torch.zeros(G, N_max, d, device=device)
        ctx_rows = 1 if self.shared else N_max
        self.contexts = torch.zeros(G, ctx_rows, n_max, d, device=device)
        self.context_mask = torch.zeros(G, n_max, dtype=torch.bool, device=device)
        label_shape = (G, N_max) if self.task == "classification" else (G, N_max, first.labels.shape[1])
        self.labels = torch.zeros(label_shape, dtype=first.labels.dtype, device=device)
        for j, ds in enumerate(unique):
            self.queries[j, : ds.N] = ds.queries
            self.contexts[j, : ds.contexts.shape[0], : ds.n] = ds.contexts
            self.context_mask[j, : ds.n] = True
            self.labels[j, : ds.N] = ds.labels

        self._masks = (
            None if bool(self.context_mask.all()) else self.context_mask[self.member_data]
        )  # (E, n_max)
        self._full_batch = self._make_full_batch()

    @property
    def num_members(self) -> int:
        return self.member_data.shape[0]

    # -- engine protocol -------------------------------------------------------------------------
    def batch(self, step: int, generator: torch.Generator) -> Batch:
        """Indices (E, B') with B' = max_e min(N_e, B): full set where N_e <= B, else floor(u N_e)."""
        u = torch.rand(self.batch_size, generator=generator, dtype=torch.float64)  # (B,), drawn every step
        if self._full_batch is not None:
            return self._full_batch
        N = self.N.cpu()
        width = int(N.clamp(max=self.batch_size).max())
        full = self.batch_size >= N  # (E,)
        ar = torch.arange(width)
        sampled = (
            (u[None, :width] * N[:, None].double()).floor().long().clamp(max=(N - 1)[:, None])
        )  # (E, B')
        index = torch.where(full[:, None], ar[None].clamp(max=(N - 1)[:, None]), sampled)  # (E, B')
        valid = torch.where(full[:, None], ar[None] < N[:, None], torch.ones_like(sampled, dtype=torch.bool))
        device = self.queries.device
        return Batch(index.to(device), valid.to(device))

    def _make_full_batch(self) -> Batch | None:
        """The fixed batch when every member trains on its whole set (N_e <= B for all e), else None."""
        if int(self.N.max()) > self.batch_size:
            return None
        width = int(self.N.max())
        ar = torch.arange(width, device=self.N.device)
        index = torch.minimum(ar[None], (self.N - 1)[:, None])  # (E, B')
        batch = Batch(index, ar[None] < self.N[:, None])
        batch.inputs = self.inputs(index)
        return batch

    def inputs(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (E, B, d), contexts (E, B, n, d) or shared (E, n, d), labels (E, B[, d_o])
        for ``index``."""
        g = self.member_data[:, None]  # (E, 1)
        queries = self.queries[g, index]  # (E, B, d)
        contexts = self.contexts[self.member_data, 0] if self.shared else self.contexts[g, index]
        return queries, contexts, self.labels[g, index]

    def masks(self) -> torch.Tensor | None:
        """(E, n_max) True for each member's real context rows; None when no member is padded."""
        return self._masks

    def per_example_loss(self, outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(E, B) cross-entropy or squared error (mean over outputs)."""
        if self.task == "classification":
            return F.cross_entropy(outputs.transpose(1, 2), labels, reduction="none")  # (E, B)
        return (outputs - labels).pow(2).mean(-1)  # (E, B)

    def loss(self, model: MHAEnsemble, batch: Batch) -> torch.Tensor:
        queries, contexts, labels = batch.inputs if batch.inputs is not None else self.inputs(batch.index)
        outputs = model(queries, contexts, self.masks())  # (E, B, d_o)
        per = self.per_example_loss(outputs, labels) * batch.valid  # (E, B)
        return per.sum(1) / batch.valid.sum(1)

    def memorized_mask(self, model: MHAEnsemble) -> torch.Tensor:
        """(E, N_max) bool: example memorized (padded examples are False)."""
        N_max = self.queries.shape[1]
        out = torch.zeros(self.num_members, N_max, dtype=torch.bool, device=self.queries.device)
        for start in range(0, N_max, self.eval_chunk):
            idx = torch.arange(start, min(start + self.eval_chunk, N_max), device=self.queries.device)
            index = idx[None].expand(self.num_members, -1)  # (E, C)
            queries, contexts, labels = self.inputs(index)
            outputs = model(queries, contexts, self.masks())  # (E, C, d_o)
            if self.task == "classification":
                ok = outputs.argmax(-1) == labels
            else:
                ok = ((outputs - labels).abs() <= self.error_tolerance).all(-1)
            out[:, idx] = ok & (idx[None] < self.N[:, None])
        return out

    def accuracy(self, model: MHAEnsemble) -> torch.Tensor:
        """(E,) share of each member's N examples memorized."""
        return self.memorized_mask(model).sum(1).double() / self.N.double()

    def attention_weights(self, model: MHAEnsemble, member: int) -> torch.Tensor:
        """(N, H, n) attention of member ``member`` on its own examples (no padding)."""
        single = model.member(member)
        j, N, n = int(self.member_data[member]), int(self.N[member]), int(self.n[member])
        chunks = []
        with torch.no_grad():
            for start in range(0, N, self.eval_chunk):
                stop = min(start + self.eval_chunk, N)
                q = self.queries[j, start:stop][None]  # (1, C, d)
                ctx = self.contexts[j, 0, :n][None] if self.shared else self.contexts[j, start:stop, :n][None]
                s, _ = single.features(q, ctx)
                chunks.append(s[0])  # (C, H, n)
        return torch.cat(chunks)
