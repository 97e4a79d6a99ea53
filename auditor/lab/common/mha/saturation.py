"""Softmax saturation (Paper A, Appendix H): do heads specialise by saturating on most examples?

Head h is *saturated* on example t when its largest attention weight exceeds a threshold (0.99 in the
paper): the head then copies one context row and is blind to the others. The proof of Theorem 1 makes
each head responsible for a few examples and saturated elsewhere; the paper observed that most heads
saturate on most examples while almost every example keeps at least one unsaturated head.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from auditor.core.errors import AuditError

DEFAULT_THRESHOLD = 0.99


@dataclass(frozen=True)
class Saturation:
    """Saturation statistics of one layer on N examples with H heads."""

    per_head: torch.Tensor  # (H,) share of examples on which the head is saturated
    per_example: torch.Tensor  # (N,) number of saturated heads
    threshold: float

    @property
    def heads(self) -> int:
        return self.per_head.numel()

    @property
    def with_free_head(self) -> float:
        """Share of examples with at least one unsaturated head."""
        return float((self.per_example < self.heads).double().mean())

    def head_frame(self) -> pd.DataFrame:
        """One row per head: head, saturated_fraction."""
        return pd.DataFrame({"head": range(self.heads), "saturated_fraction": self.per_head.tolist()})

    def histogram(self) -> pd.DataFrame:
        """Examples by number of saturated heads: saturated_heads, examples (0 .. H)."""
        counts = torch.bincount(self.per_example, minlength=self.heads + 1)
        return pd.DataFrame({"saturated_heads": range(self.heads + 1), "examples": counts.tolist()})


def saturation(attention: torch.Tensor, threshold: float = DEFAULT_THRESHOLD) -> Saturation:
    """Saturation of attention weights ``attention``: (N, H, n), rows in the simplex."""
    if attention.dim() != 3:
        raise AuditError(f"attention must be (N, H, n), got shape {tuple(attention.shape)}")
    if not 0 < threshold < 1:
        raise AuditError(f"saturation threshold must be in (0, 1), got {threshold}")
    saturated = attention.max(dim=-1).values > threshold  # (N, H)
    return Saturation(
        per_head=saturated.double().mean(0).cpu(), per_example=saturated.sum(1).cpu(), threshold=threshold
    )
