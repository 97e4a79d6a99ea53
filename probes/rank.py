"""Numerical rank with the tolerance of the dtype the data was produced in.

The rule is the one of ``torch.linalg.matrix_rank`` (and NumPy): a singular value counts when it
exceeds ``tol = sigma_max * rtol`` with the default ``rtol = max(m, n) * eps``. Here ``eps`` is the
machine epsilon of the dtype the input was PRODUCED in (float32 activations are judged at float32
tolerance), while the arithmetic always runs in float64, so the verdict is not blurred by the
arithmetic itself.

Every verdict comes with a *margin*: the distance, in decades, between the threshold and the nearest
deciding singular value (the last one kept, sigma_r, and the first one dropped, sigma_{r+1}). A margin
of 3 means the tolerance would have to change a thousandfold to flip the verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

Array = torch.Tensor | np.ndarray


@dataclass(frozen=True)
class RankResult:
    """Ranks of a matrix or a batch of matrices.

    Attributes:
        rank: (*batch) int64 numerical ranks.
        margin: (*batch) float64 decades between the threshold and the nearest deciding singular value
            (``inf`` when no singular value is near, e.g. an exactly zero matrix).
        tol: (*batch) float64 absolute thresholds ``sigma_max * rtol``.
        rtol: the relative tolerance used.
    """

    rank: torch.Tensor
    margin: torch.Tensor
    tol: torch.Tensor
    rtol: float


def as_tensor(a: Array, name: str = "input") -> torch.Tensor:
    """Accept a torch tensor or a NumPy array (left on its device); reject anything else."""
    if isinstance(a, np.ndarray):
        a = torch.from_numpy(a)
    if not isinstance(a, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    if a.is_complex():
        raise ValueError(f"{name} must be real-valued, got dtype {a.dtype}")
    return a


def check_finite(a: torch.Tensor, name: str) -> None:
    """Raise a one-line ValueError when ``a`` holds NaN or Inf values."""
    if a.is_floating_point():
        bad = (~torch.isfinite(a)).sum().item()
        if bad:
            raise ValueError(f"{name} holds {bad} NaN/Inf values of {a.numel()}; only finite values are valid")


def eps_of(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype; integer and bool data count as exact (float64)."""
    return torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float64).eps


def default_rtol(m: int, n: int, dtype: torch.dtype) -> float:
    """``max(m, n) * eps(dtype)``: the relative tolerance of ``matrix_rank`` for an (m, n) matrix."""
    return max(m, n) * eps_of(dtype)


def resolve_rtol(rtol: float | None, m: int, n: int, dtype: torch.dtype) -> float:
    """Validate a user tolerance, or return the default for data produced in ``dtype``."""
    if rtol is None:
        return default_rtol(m, n, dtype)
    if not isinstance(rtol, int | float) or not math.isfinite(rtol) or not 0 <= rtol < 1:
        raise ValueError(f"rtol must be a finite number in [0, 1), got {rtol!r}")
    return float(rtol)


def margins_from_singular_values(sv: torch.Tensor, tol: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ranks and margins from descending singular values.

    Args:
        sv: (*batch, p) descending, float64.
        tol: (*batch) absolute thresholds.
    Returns:
        rank (*batch) int64 and margin (*batch) float64 in decades.
    """
    above = sv > tol[..., None]  # (*batch, p)
    rank = above.sum(-1)
    p = sv.shape[-1]
    tiny = torch.finfo(torch.float64).tiny
    inf = torch.full_like(tol, math.inf)
    idx_kept = (rank - 1).clamp(min=0)[..., None]
    idx_drop = rank.clamp(max=p - 1)[..., None]
    kept = sv.gather(-1, idx_kept)[..., 0]
    dropped = sv.gather(-1, idx_drop)[..., 0]
    safe_tol = tol.clamp(min=tiny)
    m_kept = torch.where(rank > 0, torch.log10(kept / safe_tol), inf)
    m_drop = torch.where(
        (rank < p) & (dropped > 0), torch.log10(safe_tol / dropped.clamp(min=tiny)), inf
    )
    margin = torch.minimum(m_kept, m_drop)
    return rank, torch.where(tol > 0, margin, inf)


def numerical_rank(a: Array, rtol: float | None = None, *, source_dtype: torch.dtype | None = None) -> RankResult:
    """Numerical rank of one matrix or a batch, computed from float64 singular values.

    Args:
        a: (..., m, n) real matrix or batch of matrices, on any device.
        rtol: relative tolerance; a singular value counts when ``> sigma_max * rtol``. Default
            ``max(m, n) * eps`` of ``source_dtype`` (by default the dtype of ``a``).
        source_dtype: the dtype the data was produced in, when ``a`` was cast since.

    Returns:
        :class:`RankResult` with ``rank``, ``margin`` (decades) and ``tol``, shaped like the batch.

    Raises:
        ValueError: not 2-D or more, empty, or non-finite input; rtol outside [0, 1).
    """
    a = as_tensor(a, "matrix")
    if a.ndim < 2:
        raise ValueError(f"numerical_rank needs a matrix (..., m, n); got shape {tuple(a.shape)}")
    m, n = a.shape[-2:]
    if m == 0 or n == 0 or a.numel() == 0:
        raise ValueError(f"numerical_rank needs a non-empty matrix; got shape {tuple(a.shape)}")
    check_finite(a, "matrix")
    rtol = resolve_rtol(rtol, m, n, source_dtype or a.dtype)
    sv = torch.linalg.svdvals(a.to(torch.float64))  # (..., min(m, n)) descending
    tol = sv[..., 0] * rtol
    rank, margin = margins_from_singular_values(sv, tol)
    return RankResult(rank=rank, margin=margin, tol=tol, rtol=rtol)
