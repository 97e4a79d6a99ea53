"""A small GPT-style language model (the architecture Morris et al. measure, at 10^4 - 10^6 parameters).

Pre-norm decoder blocks (LayerNorm -> causal multi-head self-attention -> residual, LayerNorm -> MLP of
width 4 d with GELU -> residual), learned token and position embeddings, a final LayerNorm and an output
layer tied to the token embedding (GPT-2's layout, as in nanoGPT). The inputs are a BOS token followed
by the sequence, so every token of the sequence is predicted (from BOS and the tokens before it) and
the data's entropy is counted over all of them. Biases everywhere, as GPT-2.

``parameters`` counts every trainable number (the tied output layer once), the count a bits-per-parameter
figure divides by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from auditor.core.errors import AuditError


@dataclass(frozen=True)
class GPTShape:
    """The shape of one model: ``layers`` blocks of width ``d`` with ``heads`` heads, over ``vocab`` data
    tokens (plus BOS) and sequences of ``seq_len`` tokens."""

    layers: int
    d: int
    heads: int
    vocab: int
    seq_len: int

    def __post_init__(self) -> None:
        for name in ("layers", "d", "heads", "seq_len"):
            if getattr(self, name) < 1:
                raise AuditError(f"GPT {name} must be >= 1, got {getattr(self, name)}")
        if self.vocab < 2:
            raise AuditError(f"the vocabulary needs at least 2 tokens, got {self.vocab}")
        if self.d % self.heads:
            raise AuditError(f"GPT width d = {self.d} must be a multiple of heads = {self.heads}")

    @property
    def parameters(self) -> int:
        """Trainable numbers: embeddings (vocab + 1 tokens, seq_len positions), per block 2 LayerNorms, the
        attention (qkv and output projections with biases) and the MLP (d -> 4d -> d with biases), the final
        LayerNorm; the output layer is the token embedding's (tied)."""
        d = self.d
        block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        return (self.vocab + 1) * d + self.seq_len * d + self.layers * block + 2 * d


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, d) -> (B, T, d)."""
        B, T, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)  # (B, T, d) each
        q, k, v = (t.view(B, T, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))  # (B,h,T,dh)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, dh)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """The model of a :class:`GPTShape`; ``forward(tokens)`` gives the logits over the data tokens of every
    position of ``[BOS, tokens]`` but the last: (B, T, vocab) for tokens (B, T)."""

    def __init__(self, shape: GPTShape, generator: torch.Generator) -> None:
        super().__init__()
        self.shape = shape
        d = shape.d
        self.tokens = nn.Embedding(shape.vocab + 1, d)  # the last row is BOS
        self.positions = nn.Embedding(shape.seq_len, d)
        self.blocks = nn.ModuleList(Block(d, shape.heads) for _ in range(shape.layers))
        self.ln = nn.LayerNorm(d)
        with torch.no_grad():  # GPT-2's initialisation, from the unit's own generator
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    residual = name.endswith(("proj.weight", "out.weight"))  # scaled by depth, as GPT-2
                    std = 0.02 / math.sqrt(2 * shape.layers) if residual else 0.02
                    p.copy_(torch.randn(p.shape, generator=generator) * std)
                elif name.endswith("bias"):
                    p.zero_()
        if sum(p.numel() for p in self.parameters()) != shape.parameters:
            raise AssertionError("TinyGPT's parameters do not match GPTShape.parameters")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        B, T = tokens.shape
        bos = torch.full((B, 1), self.shape.vocab, dtype=tokens.dtype, device=tokens.device)
        inputs = torch.cat([bos, tokens[:, :-1]], dim=1)  # (B, T): position t sees BOS and tokens < t
        x = self.tokens(inputs) + self.positions.weight[:T]  # (B, T, d)
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tokens.weight[: self.shape.vocab].T  # (B, T, vocab), tied output layer
