"""Fast batched full-rank decisions for many small matrices (k rows of width d, k <= d).

The question asked of every k x d matrix X_S (a k-subset of a pool, or one context) is whether its
smallest singular value sigma_k exceeds ``tol = rtol * sigma_max``; when it does not, its rank. The
answer must equal the float64 SVD answer at the same tolerance. Three stages, each exact where it
decides:

1. Gram + shifted Cholesky (cheap, level-3, batched on CPU and CUDA alike). With G = X_S X_S^T in
   float64, sigma_k^2 = lambda_min(G). An upper bound ``lam_hi >= lambda_max`` (min of trace and the
   Gershgorin row sum) gives ``tol_hi >= tol``. If the Cholesky factorisation of
   ``G - (tol_hi^2 + 2 delta) I`` succeeds, then lambda_min > tol^2: the matrix is full rank.
   ``delta`` bounds the float64 error of forming and factoring G, so a success is a proof, not an
   estimate. The margin of a certified matrix is a proven lower bound from the same factor L:
   lambda_min(G - s I) >= 1 / |L^-1|_F^2 (one batched triangular inverse).
2. Eigenvalues of G (``eigvalsh``) for the matrices stage 1 did not certify: exact ranks and margins,
   except where an eigenvalue lies within the float64 error band around tol^2.
3. float64 SVD of X_S itself for those few (and for data whose tolerance is below the Gram's
   resolution, e.g. float64-produced vectors that are nearly dependent).

Stage 1 decides almost every subset of well-conditioned data; stage 2 handles dependent subsets (e.g.
identical CLS tokens) at eigvalsh speed; stage 3 keeps the verdicts exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from probes.rank import margins_from_singular_values

_F64_EPS = torch.finfo(torch.float64).eps
_GUARD = 8.0  # safety factor on the float64 error bound of the Gram route


@dataclass
class Decisions:
    """Per-matrix outcome: rank (S,), margin (S,) in decades (a lower bound where certified), and how
    many matrices each stage decided."""

    rank: torch.Tensor
    margin: torch.Tensor
    stages: dict[str, int]


def _gram_error(gram: torch.Tensor, lam_hi: torch.Tensor, width: int) -> torch.Tensor:
    """Bound on the float64 error of forming and factoring each Gram matrix: (c,)."""
    k = gram.shape[-1]
    return _GUARD * (k + width) * _F64_EPS * lam_hi


def decide(
    gram: torch.Tensor,
    rows,
    rtol: float,
    width: int,
) -> Decisions:
    """Ranks and margins of c matrices given their Gram matrices.

    Args:
        gram: (c, k, k) float64 Gram matrices X_S X_S^T.
        rows: callable taking a LongTensor of positions in 0..c-1 and returning the matching (c', k, d)
            float64 matrices X_S (only called for the few that need the exact SVD).
        rtol: relative tolerance (singular values above ``rtol * sigma_max`` count).
        width: d, the row width (enters the float64 error bound of the Gram route).
    """
    c, k, _ = gram.shape
    device = gram.device
    rank = torch.full((c,), k, dtype=torch.int64, device=device)
    margin = torch.full((c,), math.inf, dtype=torch.float64, device=device)
    stages = {"cholesky": 0, "eigvalsh": 0, "svd": 0}
    if c == 0:
        return Decisions(rank, margin, stages)

    diag = gram.diagonal(dim1=-2, dim2=-1)  # (c, k)
    trace = diag.sum(-1)
    gersh = gram.abs().sum(-1).amax(-1)
    lam_hi = torch.minimum(trace, gersh)  # >= lambda_max
    delta = _gram_error(gram, lam_hi, width)

    # Stage 1: certify full rank: Cholesky of G - s I succeeds  =>  lambda_min(G) > s >= tol^2.
    tol_hi2 = rtol**2 * lam_hi  # (c,) >= tol^2
    shift = tol_hi2 + 2 * delta
    eye = torch.eye(k, dtype=gram.dtype, device=device)
    chol, info = torch.linalg.cholesky_ex(gram - shift[:, None, None] * eye)  # (c, k, k), (c,)
    certified = (info == 0) & (lam_hi > 0)
    if bool(certified.any()):
        # Certified margin: lambda_min(G - sI) >= 1 / trace((G - sI)^-1) = 1 / |L^-1|_F^2, so
        # sigma_k^2 >= s + 1 / |L^-1|_F^2 and tol^2 <= tol_hi^2.
        lc = chol[certified]
        inv = torch.linalg.solve_triangular(lc, eye.expand_as(lc), upper=False)  # (c', k, k) = L^-1
        lam_lo = shift[certified] - 2 * delta[certified] + 1.0 / inv.square().sum((-2, -1))
        margin[certified] = 0.5 * torch.log10(lam_lo / tol_hi2[certified].clamp(min=torch.finfo(gram.dtype).tiny))
    stages["cholesky"] = int(certified.sum())
    todo = (~certified).nonzero().flatten()
    if todo.numel() == 0:
        return Decisions(rank, margin, stages)

    # Stage 2: eigenvalues of the remaining Gram matrices.
    lam = torch.linalg.eigvalsh(gram[todo]).flip(-1).clamp(min=0)  # (t, k) descending
    lam_max = lam[:, 0]
    tol2 = rtol**2 * lam_max
    err = _gram_error(gram[todo], lam_hi[todo], width)
    ambiguous = ((lam - tol2[:, None]).abs() <= 2 * err[:, None]).any(-1) & (lam_max > 0)
    sv = lam.sqrt()
    r2, m2 = margins_from_singular_values(sv, rtol * sv[:, 0])
    ok = ~ambiguous
    rank[todo[ok]] = r2[ok]
    margin[todo[ok]] = m2[ok]
    stages["eigvalsh"] = int(ok.sum())

    # Stage 3: exact float64 SVD of the matrices themselves.
    hard = todo[ambiguous]
    if hard.numel():
        sv3 = torch.linalg.svdvals(rows(hard))  # (h, k)
        r3, m3 = margins_from_singular_values(sv3, rtol * sv3[:, 0])
        rank[hard] = r3
        margin[hard] = m3
        stages["svd"] = int(hard.numel())
    return Decisions(rank, margin, stages)


def chunk_size(k: int, d: int, budget_bytes: int = 256 * 2**20) -> int:
    """How many k x k (plus k x d for the fallback) float64 matrices fit in the memory budget."""
    per = 8 * (3 * k * k + k * d)
    return max(1, budget_bytes // per)


def subset_decisions(
    vectors64: torch.Tensor,
    subsets: torch.Tensor,
    rtol: float,
    pool_gram: torch.Tensor | None,
) -> Decisions:
    """Decide every k-subset of a pool.

    Args:
        vectors64: (N, d) float64 pool.
        subsets: (S, k) int64 row indices.
        pool_gram: (N, N) float64 Gram of the whole pool, or None to form each subset's Gram by bmm.
    """
    s, k = subsets.shape
    d = vectors64.shape[1]
    step = chunk_size(k, d)
    parts = []
    for start in range(0, s, step):
        idx = subsets[start : start + step]  # (c, k)
        if pool_gram is not None:
            gram = pool_gram[idx[:, :, None], idx[:, None, :]]  # (c, k, k)
        else:
            x = vectors64[idx]  # (c, k, d)
            gram = x @ x.transpose(1, 2)  # (c, k, k)
        parts.append(decide(gram, lambda pos, idx=idx: vectors64[idx[pos]], rtol, d))
    return _concat(parts)


def matrix_decisions(mats: torch.Tensor, rtol: float) -> Decisions:
    """Decide a batch of (k, d) matrices, k <= d (e.g. contexts for Assumption 2): (B, k, d)."""
    b, k, d = mats.shape
    step = chunk_size(k, d)
    parts = []
    for start in range(0, b, step):
        x = mats[start : start + step].to(torch.float64)  # (c, k, d)
        gram = x @ x.transpose(1, 2)  # (c, k, k)
        parts.append(decide(gram, lambda pos, x=x: x[pos], rtol, d))
    return _concat(parts)


def _concat(parts: list[Decisions]) -> Decisions:
    stages = {key: sum(p.stages[key] for p in parts) for key in parts[0].stages}
    return Decisions(
        torch.cat([p.rank for p in parts]), torch.cat([p.margin for p in parts]), stages
    )
