"""One-layer transformers on the factual recall task (paper C), as batched ensembles.

The model of paper C: frozen random token embeddings and unembeddings (entries N(0, 1/d)), one layer
of H softmax heads of dimension d_h in which only the last (EOS) position queries, then an optional
ReLU MLP of width m with a residual connection, and a read-out against the R D answer unembeddings:

    q_h = W_Q^h^T e_EOS,  s_h = softmax(X W_K^h q_h / sqrt(d_h)),  z = sum_h W_O^h^T W_V^h^T X^T s_h
    y   = z + W_2 relu(W_1 z + b_1)        (attention-only: m = 0, y = z)
    logits = U y                            U: (R D, d)

There are no positional embeddings (as in the authors' code): the answer depends on the set of tokens.
Trainable parameters are counted as 4 H d_h d + 2 m d (the paper's count; the m biases are reported
separately).

Members of one ensemble share d, H and d_h; they may differ in the MLP width m (padded, with a mask on
the hidden units), in the fact table (S, R, D padded by :class:`~auditor.lab.recall.task.FactBank`)
and in the seed. A member's embeddings and initial weights depend only on its own (S, R, D, m, seed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.lab.engine import Ensemble
from auditor.lab.recall.task import DEFAULT_PROMPT_LENGTH, FactBank, FactTable, PromptBatch, member_generator

_TRAIN_STREAM, _EVAL_STREAM = 1, 2


@dataclass(frozen=True)
class RecallMember:
    """One model to train: architecture (d, H, d_h, m), its facts and its seed."""

    d: int
    heads: int
    head_dim: int
    width: int  # MLP width m; 0 = attention-only
    facts: FactTable
    seed: int = 0

    def __post_init__(self) -> None:
        if self.d < 1 or self.heads < 1 or self.head_dim < 1:
            raise AuditError(
                f"need d, H, d_h >= 1, got d={self.d}, H={self.heads}, d_h={self.head_dim} "
                "(a head dimension that rounds to 0 is a configuration error, not a model)"
            )
        if self.width < 0:
            raise AuditError(f"MLP width m must be >= 0 (0 = attention-only), got {self.width}")

    @property
    def parameters(self) -> int:
        """4 H d_h d + 2 m d: the paper's count of trainable parameters."""
        return recall_parameters(self.d, self.heads, self.head_dim, self.width)


def recall_parameters(d: int, heads: int, head_dim: int, width: int) -> int:
    """Trainable parameters on the paper's axis: 4 H d_h d (W_Q, W_K, W_V, W_O) + 2 m d (MLP)."""
    return 4 * heads * head_dim * d + 2 * width * d


class RecallTransformer(Ensemble):
    """E one-layer transformers; shapes: embeddings (E, V, d) and unembeddings (E, A, d) are frozen
    buffers; W_Q, W_K, W_V: (E, H, d, d_h); W_O: (E, H, d_h, d); W_1: (E, d, m_max), b_1: (E, m_max),
    W_2: (E, m_max, d) with ``hidden_mask`` (E, m_max)."""

    def __init__(self, members: Sequence[RecallMember], bank: FactBank) -> None:
        super().__init__(len(members))
        shapes = {(mem.d, mem.heads, mem.head_dim) for mem in members}
        if len(shapes) != 1:
            raise AuditError(f"members of one ensemble must share (d, H, d_h); got {sorted(shapes)}")
        d, H, dh = shapes.pop()
        self.d, self.heads, self.head_dim = d, H, dh
        self.width = max(mem.width for mem in members)
        E, V, A = len(members), bank.vocab_size, int(bank.num_answers.max())
        embed, unembed = torch.zeros(E, V, d), torch.zeros(E, A, d)
        wq, wk, wv = (torch.zeros(E, H, d, dh) for _ in range(3))
        wo = torch.zeros(E, H, dh, d)
        w1, w2 = torch.zeros(E, d, self.width), torch.zeros(E, self.width, d)
        mask = torch.zeros(E, self.width)
        eos = torch.zeros(E, dtype=torch.long)
        for i, (mem, table) in enumerate(zip(members, bank.tables)):
            g = torch.Generator().manual_seed(mem.seed)
            embed[i, : table.vocab_size] = torch.randn(table.vocab_size, d, generator=g) / math.sqrt(d)
            unembed[i, : table.num_answers] = torch.randn(table.num_answers, d, generator=g) / math.sqrt(d)
            for w in (wq, wk, wv):
                w[i] = torch.randn(H, d, dh, generator=g) / math.sqrt(dh)
            wo[i] = torch.randn(H, dh, d, generator=g) / math.sqrt(d)
            if mem.width:
                w1[i, :, : mem.width] = torch.randn(d, mem.width, generator=g) / math.sqrt(d)
                w2[i, : mem.width] = torch.randn(mem.width, d, generator=g) / math.sqrt(mem.width)
                mask[i, : mem.width] = 1.0
            eos[i] = table.eos_token
        self.register_buffer("embed", embed)
        self.register_buffer("unembed", unembed)
        self.register_buffer("eos", eos)
        self.register_buffer("hidden_mask", mask)
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Parameter(w) for w in (wq, wk, wv, wo))
        if self.width:
            self.w_1 = nn.Parameter(w1)
            self.b_1 = nn.Parameter(torch.zeros(E, self.width))
            self.w_2 = nn.Parameter(w2)

    def features(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (E, B, T) -> the EOS position's output before the read-out: (E, B, d).

        Only EOS queries and its embedding is fixed, so the query-key product collapses to one vector
        per head, k_h = W_K^h W_Q^h^T e_EOS / sqrt(d_h), and the value-output path to one matrix per
        head, W_V^h W_O^h: the same function in fewer, larger matrix products.
        """
        E, B, T = tokens.shape
        x = self.embed_tokens(tokens)  # (E, B, T, d)
        e_eos = self.embed[torch.arange(E), self.eos]  # (E, d)
        kq = torch.einsum("ehdk,ehfk,ef->edh", self.w_k, self.w_q, e_eos) / math.sqrt(
            self.head_dim
        )  # (E, d, H)
        scores = torch.bmm(x.view(E, B * T, self.d), kq).view(E, B, T, self.heads)  # (E, B, T, H)
        attn = torch.softmax(scores.transpose(2, 3).contiguous(), dim=-1)  # (E, B, H, T)
        pooled = torch.matmul(attn, x)  # (E, B, H, d)
        w_vo = torch.matmul(self.w_v, self.w_o).reshape(E, self.heads * self.d, self.d)  # (E, H d, d)
        z = torch.bmm(pooled.reshape(E, B, self.heads * self.d), w_vo)  # (E, B, d)
        if self.width:
            hidden = torch.relu(torch.baddbmm(self.b_1[:, None, :], z, self.w_1))  # (E, B, m)
            z = z + torch.bmm(hidden * self.hidden_mask[:, None, :], self.w_2)  # (E, B, d)
        return z

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """Each member's own embeddings of its tokens: (E, B, T) -> (E, B, T, d)."""
        E, V = self.embed.shape[:2]
        flat = (
            tokens + (torch.arange(E, device=tokens.device) * V)[:, None, None]
        )  # row in the stacked tables
        return nn.functional.embedding(flat, self.embed.view(E * V, self.d))  # (E, B, T, d)

    def features_reference(self, tokens: torch.Tensor) -> torch.Tensor:
        """The same map computed literally, head by head and position by position (for tests)."""
        E = self.num_members
        x = self.embed[torch.arange(E)[:, None, None], tokens]  # (E, B, T, d)
        e_eos = self.embed[torch.arange(E), self.eos]  # (E, d)
        q = torch.einsum("ed,ehdk->ehk", e_eos, self.w_q)  # (E, H, d_h)
        keys = torch.einsum("ebtd,ehdk->ebhtk", x, self.w_k)  # (E, B, H, T, d_h)
        attn = torch.softmax(torch.einsum("ebhtk,ehk->ebht", keys, q) / math.sqrt(self.head_dim), dim=-1)
        values = torch.einsum("ebtd,ehdk->ebhtk", x, self.w_v)  # (E, B, H, T, d_h)
        heads = torch.einsum("ebht,ebhtk->ebhk", attn, values)  # (E, B, H, d_h)
        z = torch.einsum("ebhk,ehkd->ebd", heads, self.w_o)  # (E, B, d)
        if self.width:
            hidden = (
                torch.relu(torch.einsum("ebd,edm->ebm", z, self.w_1) + self.b_1[:, None, :])
                * self.hidden_mask[:, None, :]
            )
            z = z + torch.einsum("ebm,emd->ebd", hidden, self.w_2)  # (E, B, d)
        return z

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (E, B, T) -> logits over the padded answers: (E, B, A_max)."""
        return torch.bmm(self.features(tokens), self.unembed.transpose(1, 2))  # (E, B, A)


class RecallTask:
    """Fresh prompts every step; accuracy over ALL S R facts of every member (the engine's ``Task``).

    Prompts of member i come from generators seeded by (``seeds[i]``, step) only
    (:func:`~auditor.lab.recall.task.member_generator`), so a member trains on the same data alone or
    in any ensemble, and a resumed run redraws the same prompts; the engine's generator is not used.
    The evaluation set holds every fact in ``eval_contexts`` noisy prompts, drawn once (every evaluation
    of a run sees the same prompts). ``accuracy`` is the fraction of those prompts answered correctly;
    :meth:`fact_recall` the fraction of facts right in every context.
    """

    def __init__(self, bank: FactBank, seeds: Sequence[int], *, batch_size: int = 1024,
                 eval_contexts: int = 4, eval_chunk: int = 2048) -> None:
        if batch_size < 1:
            raise AuditError(f"batch_size must be >= 1, got {batch_size}")
        self.bank = bank
        self.seeds = list(seeds)
        self.batch_size = batch_size
        self.eval_contexts = eval_contexts
        self.eval_chunk = eval_chunk
        self.eval_set = bank.all_facts(eval_contexts, [member_generator(s, _EVAL_STREAM) for s in self.seeds])
        A = int(bank.num_answers.max())
        invalid = torch.arange(A)[None, :] >= bank.num_answers[:, None]  # (E, A)
        self.answer_bias = torch.zeros(bank.num_members, 1, A).masked_fill(invalid[:, None, :], float("-inf"))

    def batch(self, step: int, generator: torch.Generator) -> PromptBatch:
        """Fresh prompts (E, B, T) for update ``step``."""
        return self.bank.sample(
            self.batch_size, [member_generator(s, _TRAIN_STREAM, step) for s in self.seeds]
        )

    def loss(self, model: Ensemble, batch: PromptBatch) -> torch.Tensor:
        """(E,) mean cross-entropy of the answers over the batch."""
        logits = model(batch.tokens) + self.answer_bias  # (E, B, A)
        nll = nn.functional.cross_entropy(logits.flatten(0, 1), batch.answers.flatten(), reduction="none")
        return nll.view_as(batch.answers).mean(1)  # (E,)

    def _eval_logits(self, model: Ensemble, batch: PromptBatch) -> torch.Tensor:
        with torch.no_grad():
            chunks = [
                model(batch.tokens[:, i : i + self.eval_chunk])
                for i in range(0, batch.tokens.shape[1], self.eval_chunk)
            ]
        return torch.cat(chunks, dim=1) + self.answer_bias  # (E, P, A)

    def correct(self, model: Ensemble) -> torch.Tensor:
        """(E, P) bool: evaluation prompt answered correctly (padding: False)."""
        pred = self._eval_logits(model, self.eval_set).argmax(-1)  # (E, P)
        return (pred == self.eval_set.answers) & self.eval_set.valid

    def accuracy(self, model: Ensemble) -> torch.Tensor:
        """(E,) fraction of the S R k evaluation prompts answered correctly."""
        return self.correct(model).sum(1).double() / self.eval_set.valid.sum(1).double()

    def fact_recall(self, model: Ensemble) -> torch.Tensor:
        """(E,) fraction of the S R facts answered correctly in all ``eval_contexts`` contexts."""
        E, k = self.bank.num_members, self.eval_contexts
        ok = self.correct(model)  # (E, P), fact-major
        p = ok.shape[1] // k * k
        per_fact = ok[:, :p].view(E, -1, k).all(-1)  # (E, F_max)
        return per_fact.sum(1).double() / (self.bank.S * self.bank.R).double()


def build_recall(members: Sequence[RecallMember], *, batch_size: int = 1024, eval_contexts: int = 4,
                 prompt_length: int = DEFAULT_PROMPT_LENGTH) -> tuple[RecallTransformer, RecallTask]:
    """The ensemble and its task for ``members`` (which must share d, H and d_h)."""
    if not members:
        raise AuditError("build_recall needs at least one member")
    bank = FactBank([mem.facts for mem in members], prompt_length)
    task = RecallTask(bank, [mem.seed for mem in members], batch_size=batch_size, eval_contexts=eval_contexts)
    return RecallTransformer(members, bank), task
