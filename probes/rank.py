"""Numerical rank with the tolerance of the dtype the data was produced in.

The rule is the one of ``torch.linalg.matrix_rank`` (and NumPy): a singular value counts when it
exceeds ``tol = sigma_max * rtol`` with the default ``rtol = max(m, n) * eps``. Here ``eps`` is the
machine epsilon of the dtype the input was PRODUCED in (float32 activations are judged at float32
tolerance), while the arithmetic always runs in float64, so the verdict is not blurred by the
arithmetic itself.

Every verdict comes with a *margin*: the distance, in decades, between the threshold and the nearest
deciding singular value (the last one kept, sigma_r, and the first one dropped, sigma_{r+1}). A margin
of 3 means the tolerance would have to change a thousandfold to flip the verdict.

Rank decisions are scale-invariant, so float64 data whose magnitude would make its Gram matrices
underflow or overflow (e.g. values near 1e-170 or 1e160) is first rescaled by an exact power of two
(:func:`pow2_rescale`); the verdicts equal those of the same data at an ordinary scale.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

Array = torch.Tensor | np.ndarray

VALID_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64)  # float8, complex, quantized and wider
# unsigned integer types are refused with a TypeError that names these
_VALID_NAMES = "bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64"
_NUMPY_TORCH = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
SAFE_EXPONENT = 200  # float64 data with max |x| in [2^-200, 2^200] is used as given (no rescaling)
SEED_RANGE = (-(2**63), 2**63 - 1)  # seeds are 64-bit: torch.Generator.manual_seed's signed range


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
    """Accept a torch tensor or a NumPy array of numbers (left on its device); reject anything else.

    A tensor that requires grad is read through ``detach()``: the probes read values, and no gradient flows
    through a rank decision. A path is refused with a hint (the probes take tensors, not files); a NumPy
    array of strings, objects or dates is a ``TypeError`` naming its dtype."""
    if isinstance(a, str | os.PathLike):
        raise ValueError(
            f"{name} must be a torch.Tensor or numpy.ndarray, got the path {str(a)!r}; the probes "
            "take tensors: load the file first"
        )
    if isinstance(a, np.ndarray):
        if a.dtype.kind not in "biufc":
            raise TypeError(
                f"{name} must hold numbers (bool, integer or floating point); got a numpy.ndarray of "
                f"dtype {a.dtype}"
            )
        if a.dtype.kind != "c" and a.dtype.name not in _NUMPY_TORCH:  # (e.g. float128, uint32)
            raise TypeError(f"{name} has the numpy dtype {a.dtype}; valid dtypes: {_VALID_NAMES}")
        a = torch.from_numpy(a)
    if not isinstance(a, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    if a.is_complex():
        raise ValueError(f"{name} must be real-valued, got dtype {a.dtype}; valid dtypes: {_VALID_NAMES}")
    if a.layout != torch.strided:
        raise ValueError(f"{name} is a sparse tensor (layout {a.layout}); the probes take dense tensors: "
                         "convert it with .to_dense()")
    if a.is_meta:
        raise ValueError(f"{name} is on the meta device, which holds no values; valid: a tensor on the CPU "
                         "or a GPU")
    if a.dtype not in VALID_DTYPES:
        raise TypeError(f"{name} has dtype {a.dtype}, which the probes do not compute with; valid dtypes: "
                        f"{_VALID_NAMES} (convert e.g. with .float())")
    return a.detach() if a.requires_grad else a


def check_finite(a: torch.Tensor, name: str) -> None:
    """Raise a one-line ValueError when ``a`` holds NaN or Inf values."""
    if a.is_floating_point():
        bad = (~torch.isfinite(a)).sum().item()
        if bad:
            raise ValueError(
                f"{name} holds {bad} NaN/Inf values of {a.numel()}; only finite values are valid"
            )


def eps_of(dtype: torch.dtype) -> float:
    """Machine epsilon of a floating dtype; integer and bool data count as exact (float64)."""
    return torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float64).eps


def default_rtol(m: int, n: int, dtype: torch.dtype) -> float:
    """``max(m, n) * eps(dtype)``: the relative tolerance of ``matrix_rank`` for an (m, n) matrix."""
    return max(m, n) * eps_of(dtype)


def check_rtol(rtol: Any) -> float | None:
    """Validate a user tolerance: None (the default of the data's dtype) or a number in (0, 1), as a float.

    The one rule for ``rtol`` everywhere: every probes function applies it, and a caller that takes ``rtol``
    from its user (the audit's configuration) calls it to refuse a bad value before any work starts."""
    if rtol is None:
        return None
    if isinstance(rtol, bool | np.bool_) or not isinstance(rtol, numbers.Real) or not 0 <= rtol < 1:
        raise ValueError(f"rtol must be a finite number in (0, 1), got {rtol!r}")
    if rtol == 0:
        raise ValueError(
            "rtol must be a finite number in (0, 1), got 0: at rtol = 0 every nonzero float64 singular "
            "value counts, rounding noise included, so no rank verdict there can be proven; use a positive "
            "rtol (None: the default of the data's dtype)"
        )
    return float(rtol)


def resolve_rtol(rtol: float | None, m: int, n: int, dtype: torch.dtype) -> float:
    """Validate a tolerance (:func:`check_rtol`), or return the default for data produced in ``dtype``."""
    checked = check_rtol(rtol)
    return default_rtol(m, n, dtype) if checked is None else checked


def check_int(value: Any, name: str, minimum: int | None = 1) -> int:
    """``value`` as a Python int: Python and NumPy integers (anything ``operator.index`` accepts) but
    not bools; at least ``minimum`` when given. Raises a one-line ValueError otherwise."""
    what = ("an integer" if minimum is None else "a positive integer" if minimum == 1
            else f"an integer >= {minimum}")
    if isinstance(value, bool | np.bool_) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    try:
        out = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be {what}, got {value!r}") from None
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return out


def check_seed(seed: Any) -> int:
    """A sampling seed: an integer in the 64-bit range ``[-2**63, 2**63 - 1]``."""
    if isinstance(seed, bool | np.bool_):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    try:
        out = operator.index(seed)
    except TypeError:
        raise ValueError(f"seed must be an integer, got {seed!r}") from None
    lo, hi = SEED_RANGE
    if not lo <= out <= hi:
        raise ValueError(f"seed must be an integer in [-2**63, 2**63 - 1] (64 bits), got {out}")
    return out


def _pow2(p: torch.Tensor) -> torch.Tensor:
    """Exactly ``2.0 ** p`` as float64, for integer p in [-1022, 1023], built from its bits."""
    return torch.bitwise_left_shift(p.to(torch.int64) + 1023, 52).view(torch.float64)


def ldexp2(t: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``t * 2**e`` for float64 ``t`` and integer ``e`` (broadcast), exact unless the result leaves
    the float64 range; e may span [-2044, 2046] (two factors)."""
    half = torch.div(e, 2, rounding_mode="floor")
    return t * _pow2(half) * _pow2(e - half)


def abs_max(t: torch.Tensor, dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """Largest |value| (over ``dims``, kept; over everything when None) as float64, without an
    elementwise copy of ``t``."""
    if dims is None:
        hi, lo = t.amax(), t.amin()
    else:
        hi, lo = t.amax(dim=dims, keepdim=True), t.amin(dim=dims, keepdim=True)
    return torch.maximum(hi.double().abs(), lo.double().abs())


def pow2_exponent(amax: torch.Tensor) -> torch.Tensor | None:
    """Exponents e with ``amax * 2**-e`` in [0.5, 1) (0 where amax is 0), or None when every amax is
    already within ``[2**-SAFE_EXPONENT, 2**SAFE_EXPONENT]`` (or 0) and nothing needs rescaling."""
    _, exp = torch.frexp(amax)  # amax = mantissa * 2**exp, mantissa in [0.5, 1)
    exp = torch.where(amax > 0, exp.to(torch.int64), 0)
    if not bool((exp.abs() > SAFE_EXPONENT).any()):
        return None
    return exp


def pow2_rescale(
    a: torch.Tensor, dims: tuple[int, ...] | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rescale float64 data by exact powers of two so that its Gram matrices neither underflow nor
    overflow.

    Args:
        a: data in any dtype; only float64 can leave the safe range (float32, float16, bfloat16 and
            integer values are within [2^-149, 2^128], whose squares float64 holds comfortably).
        dims: the dimensions of one block that shares a scale (e.g. (-2, -1) for a batch of
            matrices); None: one scale for everything.
    Returns:
        ``(scaled, e)`` with ``a = scaled * 2**e`` per block (``e`` keeps the reduced dimensions), or
        ``(a, None)`` -- the same tensor, no copy -- when no block needs rescaling.
    Raises:
        ValueError: a block whose entries span more than float64 holds at one scale (a nonzero entry
            would fall below 2^-1022 relative to the largest and lose bits): no proof covers it.
    """
    if a.dtype != torch.float64 or a.numel() == 0:
        return a, None
    e = pow2_exponent(abs_max(a, dims))
    if e is None:
        return a, None
    scaled = ldexp2(a, -e)
    check_lossless(a, scaled, e)
    return scaled, e


def check_lossless(a: torch.Tensor, scaled: torch.Tensor, e: torch.Tensor) -> None:
    """Raise the library's one-line ValueError where ``scaled = a * 2**-e`` lost a nonzero entry's bits
    (it fell below float64's normal range at that scale)."""
    if bool((ldexp2(scaled, e) == a).all()):
        return
    nonzero = a[a != 0].abs()
    # (the largest value: of ``a``, or of what shares its scale, e.g. the queries beside the contexts)
    top, low = max(float(nonzero.max()), math.ldexp(0.5, int(e.max()))), float(nonzero.min())
    raise ValueError(
        f"nonzero values from {low:.3g} to {top:.3g} in one pool or matrix: float64 holds at most a "
        f"ratio of 2^1021 (about 1e307) at one scale, and no rank proof covers entries it loses; valid: "
        f"every nonzero entry above {top * 2.0**-1021:.3g} here (drop or rescale the smaller ones)"
    )


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


def numerical_rank(
    a: Array, rtol: float | None = None, *, source_dtype: torch.dtype | None = None
) -> RankResult:
    """Numerical rank of one matrix or a batch, computed from float64 singular values.

    Args:
        a: (..., m, n) real matrix or batch of matrices, on any device.
        rtol: relative tolerance; a singular value counts when ``> sigma_max * rtol``. Default
            ``max(m, n) * eps`` of ``source_dtype`` (by default the dtype of ``a``).
        source_dtype: the dtype the data was produced in, when ``a`` was cast since.

    Returns:
        :class:`RankResult` with ``rank``, ``margin`` (decades) and ``tol``, shaped like the batch.

    Raises:
        ValueError: not 2-D or more, empty, or non-finite input; rtol outside (0, 1) (0 is refused:
            no verdict at it can be proven).
    """
    a = as_tensor(a, "matrix")
    if a.ndim < 2:
        raise ValueError(f"numerical_rank needs a matrix (..., m, n); got shape {tuple(a.shape)}")
    m, n = a.shape[-2:]
    if m == 0 or n == 0 or a.numel() == 0:
        raise ValueError(f"numerical_rank needs a non-empty matrix; got shape {tuple(a.shape)}")
    check_finite(a, "matrix")
    if source_dtype is not None and not isinstance(source_dtype, torch.dtype):
        raise ValueError(f"source_dtype must be a torch.dtype, got {source_dtype!r}")
    rtol = resolve_rtol(rtol, m, n, source_dtype or a.dtype)
    scaled, e = pow2_rescale(a, (-2, -1))  # a = scaled * 2**e per matrix (exact)
    sv = torch.linalg.svdvals(scaled.to(torch.float64))  # (..., min(m, n)) descending
    tol = sv[..., 0] * rtol
    rank, margin = margins_from_singular_values(sv, tol)
    if e is not None:
        tol = ldexp2(tol, e[..., 0, 0])  # back to the units of a
    return RankResult(rank=rank, margin=margin, tol=tol, rtol=rtol)
