"""The error bounds of the fast path, with their proofs.

Every decision of :mod:`probes.fast` is a floating-point computation whose outcome is a proof: a
successful shifted Cholesky factorisation proves lambda_min(G) above a target, a failing one at a
smaller shift proves it below. The bounds below say how much room each shift leaves for rounding.
Changing a constant here changes what is proven; the cost switches are in :mod:`probes.fast.tuning`.

Notation: G = X_S X_S^T the Gram matrix of a k x d matrix, u the unit roundoff, eps = 2u (float64),
gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability).

Float64 Gram route (stages 1 to 3). Forming G from rows of width d moves it by at most
gamma_d trace(G) in norm (|G64 - G| <= gamma_d |X||X|^T elementwise), and a Cholesky factorisation or
an eigendecomposition of G - s I is backward stable within gamma_{k+1} trace (Higham, Thm 10.3:
|E| <= gamma_{k+1} |L||L^T|); both are at most (k + d) eps trace / 2. :func:`gram_error` returns
``GUARD`` (k + d) eps max(lam_hi, trace / 8), at least twice that.

Float32 certificate (stage 0). Let u = 2^-24, t = trace(G64) of the subset's block of the float64 pool
Gram G64, and G the exact Gram of the float64 rows.
(a) Forming G64 (dot products of length d): |G64 - G|_2 <= gamma_d trace(G) <= 2 d eps t.
(b) The block is scaled by an exact power of two c (largest pool diagonal ~ 1, so no float32 overflow)
    and rounded to float32, and the float32 shift s32 = fl(c s) is subtracted from its diagonal in
    float32: B = c (G64 - s I) + E1 with |E1_ij| <= u c |g_ij| off the diagonal and
    |E1_ii| <= 2u (1 + u) c (g_ii + s). Since |g_ij| <= sqrt(g_ii g_jj) (up to a factor 1 + O(d eps)),
    |E1|_2 <= 3u (1 + u) c (t + s).
(c) If float32 Cholesky runs to completion on B, the computed factor satisfies L L^T = B + E2 with
    |E2| <= gamma_{k+1} |L||L^T| (Higham, Thm 10.3; any order of the inner products, blocked or not).
    With |L||L^T|_ij <= |l_i||l_j| and |l_i|^2 <= b_ii / (1 - gamma_{k+1}),
    |E2|_2 <= gamma_{k+1} / (1 - gamma_{k+1}) trace(B) <= gamma_{k+1} / (1 - gamma_{k+1}) (1 + 3u) c t.
(d) Underflow (or flush-to-zero) adds at most 2^-126 per operation: |E|_2 <= (k + 1)^2 2^-124 / c.
L L^T is positive definite, so lambda_min(G) > s - |E1|/c - |E2|/c - 2 d eps t - (d) =: s - err(s).
The shift solves s - err(s) = T, with every float32 term doubled (``F32_GUARD``), so success proves
lambda_min(G) > T (:func:`float32_shift`). The tolerance side uses its own bound lam_hi32 >=
lambda_max(G): the trace, the Gershgorin row sum of the float32 block inflated by 1 + 2 (k + 2) u
(rounding of entries and sums) and the pool's sigma_1^2, each raised by the float64 error of (a).
Dependence is never concluded in float32: its rounding is far above (rtol sigma_max)^2 at float32
tolerance.

Dependence proofs (stage 1b). Cholesky of A = G - s I fails in floating point only when
lambda_min(A) <= k (k + 1) u max_i a_ii (Demmel); :func:`dependence_slack` leaves that much room, plus
the error of forming G, below tol_lo^2.
"""

from __future__ import annotations

import torch

F64_EPS = torch.finfo(torch.float64).eps
GUARD = 8.0  # safety factor on the float64 error bound of the Gram route
F32_U = 2.0**-24  # float32 unit roundoff
F32_GUARD = 2.0  # safety factor on the (worst-case) float32 error bound of stage 0
F32_MAX_K = 4096  # above this gamma_{k+1} in float32 leaves no room: stage 0 is skipped


def gram_error(gram: torch.Tensor | None, lam_hi: torch.Tensor, width: int, *, k: int | None = None,
               trace: torch.Tensor | None = None) -> torch.Tensor:
    """(c,) bound on the float64 error of forming and factoring each Gram matrix (module docstring):
    ``GUARD`` (k + d) eps max(lam_hi, trace / 8), the guarded lam_hi term alone wherever the spectrum
    is not too flat (trace <= 8 lam_hi). ``k`` and ``trace`` of the whole matrices when ``gram`` is not
    given whole."""
    k = gram.shape[-1] if k is None else k
    if trace is None:
        trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    return GUARD * (k + width) * F64_EPS * torch.maximum(lam_hi, trace / 8)


def lam_hi_bound(gram: torch.Tensor, lam_cap: float | None, *, quick: bool = False) -> torch.Tensor:
    """(c,) upper bounds on lambda_max: trace, Gershgorin row sum, and the cap (if any).

    ``quick``: the row sums by a faster kernel (the same bound up to rounding in the last bits). The
    stages whose outcome decides a rank (1b, its shortcut, 2, 3) use the default kernel, bit for bit
    the bound they always used, so that which subsets are proven dependent never changes."""
    k = gram.shape[-1]
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    if quick:
        gersh = gram.abs().sum(-1).amax(-1)  # largest absolute row sum
    else:
        gersh = torch.linalg.vector_norm(gram, ord=1, dim=-1).amax(-1)
    return capped(torch.minimum(trace, gersh), lam_cap, k)


def capped(lam_hi: torch.Tensor, lam_cap: float | None, k: int) -> torch.Tensor:
    """lam_hi capped by the pool's sigma_1^2 (``lam_cap``, None: no cap), raised by its rounding."""
    return lam_hi if lam_cap is None else lam_hi.clamp(max=lam_cap * (1 + 64 * k * F64_EPS))


def floor_target(tol_hi2: torch.Tensor, floor: float) -> torch.Tensor:
    """T = tol_hi^2 10^(2 floor): lambda_min(G) > T proves a margin >= floor (inf where it overflows)."""
    return tol_hi2 * 10.0 ** min(2 * floor, 300.0)


def dependence_slack(dmax: torch.Tensor, lam_hi: torch.Tensor, width: int, k: int,
                     trace: torch.Tensor) -> torch.Tensor:
    """(c,) gamma: how far below tol_lo^2 the stage 1b shift sits (Demmel's bound on a failing
    Cholesky factorisation, k (k + 1) u max_i g_ii doubled, plus twice the error of forming G)."""
    return 2 * k * (k + 1) * F64_EPS * dmax + 2 * gram_error(None, lam_hi, width, k=k, trace=trace)


def cholesky_backward(k: int, trace: torch.Tensor, dmax: torch.Tensor, lam_hi: torch.Tensor) -> torch.Tensor:
    """(c,) how far below its shift s a matrix's lambda_min can lie when the Cholesky factorisation of
    G - s I succeeded: 4 ((k + 2) u trace(G) + u (max g_ii + lam_hi)) (Higham, Thm 10.3, with room for
    the rounding of the shift)."""
    u = F64_EPS / 2
    return 4 * ((k + 2) * u * trace + u * (dmax + lam_hi))


def float32_shift(target: torch.Tensor, trace: torch.Tensor, k: int, d: int, scale: float) -> torch.Tensor:
    """(c,) the float64 shift s whose float32 factorisation, if it succeeds, proves lambda_min(G) >
    ``target`` (steps (a) to (d) of the module docstring, float32 terms doubled). ``trace`` >= trace(G),
    ``scale`` the power of two the pool Gram was scaled by before rounding to float32."""
    u = F32_U
    gam = (k + 1) * u / (1 - (k + 1) * u)
    chol = gam / (1 - gam) * (1 + 3 * u)  # (c): Cholesky backward error per unit trace
    cast = 3 * u * (1 + u)  # (b): rounding the block and the shift, per unit (trace + shift)
    tiny = (k + 1) ** 2 * 2.0**-124 / scale  # (d)
    g = F32_GUARD
    return (target + (g * (chol + cast) + 2 * d * F64_EPS) * trace + g * tiny) / (1 - g * cast)


def float32_lam_hi(trace: torch.Tensor, gersh32: torch.Tensor, lam_cap: float | None, k: int,
                   d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(lam_hi32, gersh_up): lam_hi32 >= lambda_max(G) from the trace bound, the float32 block's largest
    absolute row sum ``gersh32`` (unscaled) and the cap; gersh_up >= every row sum of |G64|."""
    gersh_up = gersh32 * (1 + 2 * (k + 2) * F32_U)  # rounding of the float32 entries and sums
    lam_hi = capped(torch.minimum(trace, gersh_up + 2 * d * F64_EPS * trace), lam_cap, k)
    return lam_hi, gersh_up
