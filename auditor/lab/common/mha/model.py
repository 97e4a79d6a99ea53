"""The multi-head attention layer of Paper A as a batched :class:`~auditor.lab.engine.Ensemble`.

Two variants share one implementation:

* ``spec``: the layer as the theory states it. Per head ``s_h = softmax(E W_K^h (W_Q^h)^T e)`` over the
  n context rows (no scaling), ``z_h = (W_V^h)^T E^T s_h``, ``o = W_O^T [z_1; ...; z_H]``,
  ``y_hat = W_D^T o``. No biases.
* ``authors``: the layer as Mahdavi et al. ran their Figure 2 (facts read from their code): a
  Linear(d -> d_model) input embedding with bias plus sinusoidal positions over the (n+1)-row input whose
  row 0 is the query; the query attends only to rows 1..n; logits scaled by 1/sqrt(d_model);
  d_h = d_model by default, d_v = 1, W_O maps H*d_v -> d_model; a Linear(d_model -> outputs) decoder
  with bias. Xavier-uniform attention weights, PyTorch-default Linear initialisation.

Members of one ensemble may differ in heads H, key/query width d_h and value width d_v: parameters are
allocated at the largest size and the unused part is masked (its gradient is exactly zero, so it stays
zero). Contexts of different length n are padded by the task and masked with -inf logits. Every member
is initialised from its own seed at its own true shape, so a member's trajectory does not depend on the
other members it is batched with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from auditor.core.errors import AuditError, did_you_mean
from auditor.lab.common.mha.data import derived_seed
from auditor.lab.engine import Ensemble

VARIANTS = ("spec", "authors")


@dataclass(frozen=True)
class MHAConfig:
    """One attention layer (one member of an ensemble)."""

    heads: int  # H
    d: int  # input token width
    d_h: int  # key/query width per head
    d_v: int  # value width per head
    outputs: int  # d_o: classes (logits) or regression width
    variant: str = "spec"  # "spec" | "authors"
    d_model: int | None = None  # authors: embedding width (default d); ignored by spec
    seed: int = 0  # initialisation

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise did_you_mean("variant", self.variant, VARIANTS)
        for name in ("heads", "d", "d_h", "d_v", "outputs"):
            if getattr(self, name) < 1:
                raise AuditError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model is not None and self.d_model < 1:
            raise AuditError(f"d_model must be >= 1, got {self.d_model}")
        if self.d_h > self.width:
            where = "d" if self.variant == "spec" else "d_model"
            raise AuditError(
                f"d_h={self.d_h} exceeds {where}={self.width}: W_K (W_Q)^T has rank <= {where}, so a wider "
                f"d_h adds parameters but no attention patterns; use d_h <= {self.width}"
            )

    @property
    def width(self) -> int:
        """Width of the tokens the heads read: d (spec) or d_model (authors)."""
        return self.d if self.variant == "spec" else (self.d_model or self.d)

    @property
    def num_parameters(self) -> int:
        """Trainable parameters: H(2 w d_h + w d_v) + H d_v w + w d_o (+ embedding and biases for authors)."""
        w, H = self.width, self.heads
        count = H * (2 * w * self.d_h + w * self.d_v) + H * self.d_v * w + w * self.outputs
        if self.variant == "authors":
            count += self.d * w + w + self.outputs
        return count


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """(length, width) sin/cos positional table (sin in even, cos in odd columns)."""
    position = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    freq = torch.exp(
        torch.arange(0, width, 2, dtype=torch.float64) * (-math.log(10000.0) / width)
    )  # (ceil(w/2),)
    table = torch.zeros(length, width, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: width // 2])
    return table.float()


def _xavier(g: torch.Generator, fan_in: int, fan_out: int, *shape: int) -> torch.Tensor:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(*shape, generator=g) * 2 - 1) * bound


def _linear_default(g: torch.Generator, fan_in: int, *shape: int) -> torch.Tensor:
    bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default for weight and bias
    return (torch.rand(*shape, generator=g) * 2 - 1) * bound


class MHAEnsemble(Ensemble):
    """E attention layers trained together; member i is ``configs[i]``.

    All members share ``d``, ``outputs``, ``variant`` and the token width; H, d_h and d_v may differ.
    """

    def __init__(self, configs: Sequence[MHAConfig], max_context: int = 512) -> None:
        super().__init__(len(configs))
        first = configs[0]
        for cfg in configs:
            if (cfg.d, cfg.outputs, cfg.variant, cfg.width) != (
                first.d,
                first.outputs,
                first.variant,
                first.width,
            ):
                raise AuditError(
                    "members of one ensemble must share d, outputs, variant and d_model; bucket them"
                )
        self.configs = tuple(configs)
        self.variant = first.variant
        self.max_context = max_context
        E, w, d, o = len(configs), first.width, first.d, first.outputs
        H, dh, dv = (max(getattr(c, k) for c in configs) for k in ("heads", "d_h", "d_v"))
        self.scale = 1.0 / math.sqrt(w) if self.variant == "authors" else 1.0
        self.W_Q = nn.Parameter(torch.zeros(E, H, w, dh))
        self.W_K = nn.Parameter(torch.zeros(E, H, w, dh))
        self.W_V = nn.Parameter(torch.zeros(E, H, w, dv))
        self.W_O = nn.Parameter(torch.zeros(E, H, dv, w))  # rows of W_O in R^{H d_v x w}, head-major
        self.W_D = nn.Parameter(torch.zeros(E, w, o))
        if self.variant == "authors":
            self.W_in = nn.Parameter(torch.zeros(E, d, w))
            self.b_in = nn.Parameter(torch.zeros(E, w))
            self.b_D = nn.Parameter(torch.zeros(E, o))
            self.register_buffer("positions", sinusoidal_positions(max_context + 1, w), persistent=False)
        self.register_buffer("head_mask", torch.zeros(E, H))
        self.register_buffer("dh_mask", torch.zeros(E, dh))
        self.register_buffer("dv_mask", torch.zeros(E, dv))
        with torch.no_grad():
            for i, cfg in enumerate(configs):
                self._init_member(i, cfg)

    def _init_member(self, i: int, cfg: MHAConfig) -> None:
        """Draw member i's weights at its true shape from its own seed; the padding stays zero."""
        g = torch.Generator().manual_seed(derived_seed(cfg.seed, "init"))
        H, w, dh, dv, o = cfg.heads, cfg.width, cfg.d_h, cfg.d_v, cfg.outputs
        self.W_Q[i, :H, :, :dh] = _xavier(g, w, dh, H, w, dh)
        self.W_K[i, :H, :, :dh] = _xavier(g, w, dh, H, w, dh)
        self.W_V[i, :H, :, :dv] = _xavier(g, w, dv, H, w, dv)
        self.W_O[i, :H, :dv, :] = _xavier(g, H * dv, w, H * dv, w).reshape(
            H, dv, w
        )  # (H d_v, w) -> (H, d_v, w)
        self.W_D[i] = _linear_default(g, w, w, o)
        if self.variant == "authors":
            self.W_in[i] = _linear_default(g, cfg.d, cfg.d, w)
            self.b_in[i] = _linear_default(g, cfg.d, w)
            self.b_D[i] = _linear_default(g, w, o)
        self.head_mask[i, :H] = 1.0
        self.dh_mask[i, :dh] = 1.0
        self.dv_mask[i, :dv] = 1.0

    def member(self, i: int) -> MHAEnsemble:
        """A one-member ensemble holding member i's weights at its true shape (a copy)."""
        return self.subset([i])

    def _true_shape(self, i: int) -> dict[str, tuple[slice, ...]]:
        """Parameter name -> the slices of member i's own (unpadded) block."""
        cfg, every = self.configs[i], slice(None)
        H, dh, dv = slice(cfg.heads), slice(cfg.d_h), slice(cfg.d_v)
        blocks = {"W_Q": (H, every, dh), "W_K": (H, every, dh), "W_V": (H, every, dv), "W_O": (H, dv, every),
                  "W_D": (every, every)}
        if self.variant == "authors":
            blocks.update(W_in=(every, every), b_in=(every,), b_D=(every,))
        return blocks

    def subset(self, members: Sequence[int]) -> MHAEnsemble:
        """An ensemble of ``members`` (in that order) holding copies of their weights, padded to their own
        largest shape; :meth:`load_members` writes them back."""
        sub = MHAEnsemble([self.configs[i] for i in members], max_context=self.max_context)
        sub = sub.to(self.W_Q.device, self.W_Q.dtype)
        with torch.no_grad():
            for j, i in enumerate(members):
                for name, where in self._true_shape(i).items():
                    getattr(sub, name)[(j, *where)] = getattr(self, name)[(i, *where)]
        return sub

    def load_members(self, sub: MHAEnsemble, members: Sequence[int]) -> None:
        """Copy the weights of ``sub`` (made by :meth:`subset` with the same ``members``) back in place."""
        with torch.no_grad():
            for j, i in enumerate(members):
                for name, where in self._true_shape(i).items():
                    getattr(self, name)[(i, *where)] = getattr(sub, name)[(j, *where)]

    # -- the layer, stage by stage ------------------------------------------------------------------
    # Internally the batch dimension B comes LAST ((E, H, n, B) attention): softmax over a non-last
    # dimension of a short axis (n) is several times faster on CPU, and the masks act on the weights
    # (tiny) rather than on activations.
    def embed(self, queries: torch.Tensor, contexts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens the heads read. queries: (E, B, d); contexts: (E, B, n, d) or shared (E, n, d).

        Returns the query (E, B, w) and the context rows (E, B, n, w) / (E, n, w); identity for ``spec``.
        """
        if self.variant == "spec":
            return queries, contexts
        n = contexts.shape[-2]
        if n + 1 > self.positions.shape[0]:
            raise AuditError(f"context n={n} exceeds max_context={self.positions.shape[0] - 1} of this model")
        q = (
            torch.einsum("ebd,edw->ebw", queries, self.W_in) + self.b_in[:, None] + self.positions[0]
        )  # (E, B, w)
        if contexts.dim() == 3:
            ctx = torch.einsum("end,edw->enw", contexts, self.W_in) + self.b_in[:, None]  # (E, n, w)
        else:
            ctx = (
                torch.einsum("ebnd,edw->ebnw", contexts, self.W_in) + self.b_in[:, None, None]
            )  # (E, B, n, w)
        return q, ctx + self.positions[1 : n + 1]

    def _attention(
        self, q: torch.Tensor, ctx: torch.Tensor, context_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """(E, H, n, B) attention weights, softmax over n (dim -2)."""
        W_Q = self.W_Q * self.dh_mask[:, None, None, :]  # (E, H, w, d_h), padded key/query columns zeroed
        Q = torch.einsum("ebw,ehwk->ehkb", q, W_Q)  # (E, H, d_h, B)
        if ctx.dim() == 3:
            K = torch.einsum("enw,ehwk->ehnk", ctx, self.W_K)  # (E, H, n, d_h)
            logits = K @ Q  # (E, H, n, B)
        else:
            u = self.W_K @ Q  # (E, H, w, B) = W_K^h (W_Q^h)^T e
            logits = torch.einsum("ebnw,ehwb->ehnb", ctx, u)  # (E, H, n, B)
        logits = logits * self.scale
        if context_mask is not None:
            logits = logits.masked_fill(~context_mask[:, None, :, None], float("-inf"))
        return torch.softmax(logits, dim=-2)

    def _readout(self, s: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Outputs (E, d_o, B) from attention s: (E, H, n, B); linear in the mixed rows E(t)^T s_h(t)."""
        W_V = self.W_V * (self.head_mask[:, :, None, None] * self.dv_mask[:, None, None, :])  # (E, H, w, d_v)
        if ctx.dim() == 3:
            values = torch.einsum("enw,ehwv->ehvn", ctx, W_V)  # (E, H, d_v, n)
            v = values @ s  # (E, H, d_v, B)
        else:
            z = torch.einsum("ehnb,ebnw->ehwb", s, ctx)  # (E, H, w, B)
            v = W_V.transpose(-1, -2) @ z  # (E, H, d_v, B)
        E, H, dv, B = v.shape
        o = self.W_O.reshape(E, H * dv, -1).transpose(1, 2) @ v.reshape(E, H * dv, B)  # (E, w, B)
        y = self.W_D.transpose(1, 2) @ o  # (E, d_o, B)
        return y + self.b_D[:, :, None] if self.variant == "authors" else y

    def forward(
        self, queries: torch.Tensor, contexts: torch.Tensor, context_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """queries: (E, B, d); contexts: (E, B, n, d) or shared (E, n, d);
        context_mask: (E, n) -> (E, B, d_o).

        The result is a transposed view of a contiguous (E, d_o, B) tensor.
        """
        q, ctx = self.embed(queries, contexts)
        return self._readout(self._attention(q, ctx, context_mask), ctx).transpose(1, 2)

    def attention(
        self, q: torch.Tensor, ctx: torch.Tensor, context_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention weights s_h(t): (E, B, H, n), each row in the simplex over the unmasked context rows.

        q: (E, B, w) embedded queries; ctx: (E, B, n, w) or shared (E, n, w); context_mask: (E, n) bool,
        True for real rows (None = all real).
        """
        return self._attention(q, ctx, context_mask).permute(0, 3, 1, 2)  # (E, B, H, n)

    def features(
        self, queries: torch.Tensor, contexts: torch.Tensor, context_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention weights (E, B, H, n) and the mixed rows E(t)^T s_h(t): (E, B, H, w)
        (the rows of Z in :mod:`.certify`)."""
        q, ctx = self.embed(queries, contexts)
        s = self._attention(q, ctx, context_mask)  # (E, H, n, B)
        if ctx.dim() == 3:
            z = torch.einsum("ehnb,enw->ebhw", s, ctx)  # (E, B, H, w)
        else:
            z = torch.einsum("ehnb,ebnw->ebhw", s, ctx)  # (E, B, H, w)
        return s.permute(0, 3, 1, 2), z
