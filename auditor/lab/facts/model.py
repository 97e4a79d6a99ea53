"""One attention-only layer over the two-token prompt [k, q], as a batched Ensemble of the lab engine.

Tokens: the |K| keys take ids 0..|K|-1 and the |Q| queries ids |K|..|K|+|Q|-1 (one embedding table);
the outputs are the |V| values. For a prompt [k, q] the layer computes, at the last position (q):

    x_k, x_q = W_E[k], W_E[|K| + q]                                   # (d_model,)
    a_h      = softmax_j( (x_q W_Q^h) . (x_j W_K^h) / sqrt(d_qk) ),  j in {k, q}   # attention on k
    out      = x_q + sum_h [ a_h x_k + (1 - a_h) x_q ] W_V^h W_O^h     # residual + heads
    logits   = out W_U                                                 # (|V|,)

with W_Q^h, W_K^h: (d_model, d_qk), W_V^h: (d_model, d_vo), W_O^h: (d_vo, d_model), W_U: (d_model, |V|).
No biases, layer norm or positional embeddings: keys and queries are distinct tokens, and every logit is
then the sum E + sum_h A^h V^h that :mod:`auditor.lab.facts.layer_tensor` analyses.

d_model, H, d_qk and d_vo are set independently per member. Parameters are allocated at the largest
size in the ensemble and the unused part is masked to zero in the forward pass (its gradient is exactly
zero, so it stays zero under Adam/AdamW/SGD). Every member is initialised from its own seed at its own
shape (fan-in Gaussians), so its trajectory does not depend on the members it is batched with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.lab.engine import Ensemble


@dataclass(frozen=True)
class LayerConfig:
    """One member: the layer's widths and its initialisation seed."""

    d_model: int
    heads: int = 1
    d_qk: int = 4  # d_head,qk: key/query width per head
    d_vo: int = 4  # d_head,vo: value/output width per head
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_model", "heads", "d_qk", "d_vo"):
            if getattr(self, name) < 1:
                raise AuditError(f"{name} must be >= 1, got {getattr(self, name)}")

    def parameters(self, num_keys: int, num_queries: int, num_values: int) -> int:
        """Trainable parameters: embeddings, unembedding and per head 2 d_model (d_qk + d_vo)."""
        per_head = 2 * self.d_model * (self.d_qk + self.d_vo)
        return self.d_model * (num_keys + num_queries + num_values) + self.heads * per_head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class FactLayer(Ensemble):
    """E independent attention-only layers (see the module docstring). Shapes carry E first."""

    def __init__(
        self, configs: Sequence[LayerConfig], num_keys: int, num_queries: int, num_values: int
    ) -> None:
        super().__init__(len(configs))
        if min(num_keys, num_queries, num_values) < 1:
            raise AuditError("a fact layer needs at least one key, one query and one value")
        self.configs = tuple(configs)
        self.num_keys, self.num_queries, self.num_values = num_keys, num_queries, num_values
        E = len(configs)
        D = max(c.d_model for c in configs)
        H = max(c.heads for c in configs)
        dqk = max(c.d_qk for c in configs)
        dvo = max(c.d_vo for c in configs)
        T = num_keys + num_queries
        self.embed = nn.Parameter(torch.zeros(E, T, D))  # W_E (E, T, D)
        self.w_q = nn.Parameter(torch.zeros(E, H, D, dqk))  # (E, H, D, dqk)
        self.w_k = nn.Parameter(torch.zeros(E, H, D, dqk))  # (E, H, D, dqk)
        self.w_v = nn.Parameter(torch.zeros(E, H, D, dvo))  # (E, H, D, dvo)
        self.w_o = nn.Parameter(torch.zeros(E, H, dvo, D))  # (E, H, dvo, D)
        self.unembed = nn.Parameter(torch.zeros(E, D, num_values))  # W_U (E, D, V)
        self.register_buffer("mask_d", _prefix_mask([c.d_model for c in configs], D))  # (E, D)
        self.register_buffer("mask_h", _prefix_mask([c.heads for c in configs], H))  # (E, H)
        self.register_buffer("mask_qk", _prefix_mask([c.d_qk for c in configs], dqk))  # (E, dqk)
        self.register_buffer("mask_vo", _prefix_mask([c.d_vo for c in configs], dvo))  # (E, dvo)
        with torch.no_grad():
            for e, cfg in enumerate(configs):
                self._init_member(e, cfg)

    def _init_member(self, e: int, cfg: LayerConfig) -> None:
        g = torch.Generator().manual_seed(int(cfg.seed))
        d, h, qk, vo = cfg.d_model, cfg.heads, cfg.d_qk, cfg.d_vo
        T = self.num_keys + self.num_queries

        def gauss(*shape: int, fan_in: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g) / math.sqrt(fan_in)

        self.embed[e, :, :d] = gauss(T, d, fan_in=d)
        self.w_q[e, :h, :d, :qk] = gauss(h, d, qk, fan_in=d)
        self.w_k[e, :h, :d, :qk] = gauss(h, d, qk, fan_in=d)
        self.w_v[e, :h, :d, :vo] = gauss(h, d, vo, fan_in=d)
        self.w_o[e, :h, :vo, :d] = gauss(h, vo, d, fan_in=vo)
        self.unembed[e, :d, :] = gauss(d, self.num_values, fan_in=d)

    def weights(self) -> dict[str, torch.Tensor]:
        """The masked parameters (what the forward pass uses); shapes as in ``__init__``."""
        md, mh, mqk, mvo = self.mask_d, self.mask_h, self.mask_qk, self.mask_vo
        head = mh[:, :, None, None]  # (E, H, 1, 1)
        return {
            "embed": self.embed * md[:, None, :],
            "w_q": self.w_q * head * md[:, None, :, None] * mqk[:, None, None, :],
            "w_k": self.w_k * head * md[:, None, :, None] * mqk[:, None, None, :],
            "w_v": self.w_v * head * md[:, None, :, None] * mvo[:, None, None, :],
            "w_o": self.w_o * head * mvo[:, None, :, None] * md[:, None, None, :],
            "unembed": self.unembed * md[:, :, None],
        }

    def attention(self, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """Attention of the last position on the key token: keys, queries (E, B) -> a (E, B, H)."""
        w = self.weights()
        x_k, x_q = self._embed(w, keys, queries)
        return self._attend(w, x_k, x_q)

    def _embed(self, w: dict[str, torch.Tensor], keys: torch.Tensor, queries: torch.Tensor):
        table = w["embed"]  # (E, T, D)
        x_k = torch.gather(table, 1, keys[:, :, None].expand(-1, -1, table.shape[2]))  # (E, B, D)
        tok_q = (queries + self.num_keys)[:, :, None].expand(-1, -1, table.shape[2])
        x_q = torch.gather(table, 1, tok_q)  # (E, B, D)
        return x_k, x_q

    def _attend(self, w: dict[str, torch.Tensor], x_k: torch.Tensor, x_q: torch.Tensor) -> torch.Tensor:
        q = torch.einsum("ebd,ehdc->ebhc", x_q, w["w_q"])  # (E, B, H, dqk)
        s_k = (q * torch.einsum("ebd,ehdc->ebhc", x_k, w["w_k"])).sum(-1)  # (E, B, H)
        s_q = (q * torch.einsum("ebd,ehdc->ebhc", x_q, w["w_k"])).sum(-1)  # (E, B, H)
        scale = self.mask_qk.sum(1).rsqrt()  # (E,) 1 / sqrt(d_qk) of each member
        return torch.sigmoid((s_k - s_q) * scale[:, None, None])  # softmax over {k, q}: (E, B, H)

    def forward(self, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """Logits at the last position: keys, queries (E, B) int -> (E, B, |V|)."""
        w = self.weights()
        x_k, x_q = self._embed(w, keys, queries)
        a = self._attend(w, x_k, x_q) * self.mask_h[:, None, :]  # (E, B, H)
        vo = torch.einsum("ehdc,ehcf->ehdf", w["w_v"], w["w_o"])  # W_VO^h (E, H, D, D)
        mix = a[..., None] * x_k[:, :, None, :] + (1 - a)[..., None] * x_q[:, :, None, :]  # (E, B, H, D)
        out = x_q + torch.einsum("ebhd,ehdf->ebf", mix, vo)  # (E, B, D)
        return torch.einsum("ebd,edv->ebv", out, w["unembed"])  # (E, B, V)

    def all_logits(self, member: int | None = None) -> torch.Tensor:
        """Logits of every prompt: (E, |K|, |Q|, |V|), or (|K|, |Q|, |V|) for one ``member``."""
        K, Q = self.num_keys, self.num_queries
        keys = torch.arange(K).repeat_interleave(Q)[None].expand(self.num_members, -1)  # (E, K*Q)
        queries = torch.arange(Q).repeat(K)[None].expand(self.num_members, -1)  # (E, K*Q)
        logits = self(keys, queries).reshape(self.num_members, K, Q, self.num_values)  # (E, K, Q, V)
        return logits if member is None else logits[member]

    def member_parameters(self) -> list[int]:
        """Trainable parameter count of every member at its own shape."""
        return [c.parameters(self.num_keys, self.num_queries, self.num_values) for c in self.configs]


def _prefix_mask(sizes: Sequence[int], width: int) -> torch.Tensor:
    """(E, width) float: 1 on the first sizes[e] entries of row e."""
    return (torch.arange(width)[None, :] < torch.tensor(list(sizes))[:, None]).float()


def softmax_accuracy(logits: torch.Tensor, targets: torch.Tensor, tau: float) -> torch.Tensor:
    """Fraction of prompts whose right value has probability >= tau: logits (..., N, V), targets (..., N)."""
    prob = torch.softmax(logits.double(), -1).gather(-1, targets[..., None]).squeeze(-1)  # (..., N)
    return (prob >= tau).double().mean(-1)


def argmax_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction of prompts whose argmax is the right value: logits (..., N, V), targets (..., N)."""
    return (logits.argmax(-1) == targets).double().mean(-1)


def numpy_member(layer: FactLayer, member: int) -> dict[str, np.ndarray]:
    """One member's masked weights cut to its own shape, as float64 numpy arrays."""
    cfg = layer.configs[member]
    w = {k: v[member].detach().double().numpy() for k, v in layer.weights().items()}
    d, h, qk, vo = cfg.d_model, cfg.heads, cfg.d_qk, cfg.d_vo
    return {
        "embed": w["embed"][:, :d],
        "w_q": w["w_q"][:h, :d, :qk],
        "w_k": w["w_k"][:h, :d, :qk],
        "w_v": w["w_v"][:h, :d, :vo],
        "w_o": w["w_o"][:h, :vo, :d],
        "unembed": w["unembed"][:d],
    }
