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

When only the verdict of a dependent subset is needed (Kruskal tests, where the exact rank of a
dependent subset only feeds a histogram), a stage 1b proves dependence at Cholesky cost instead of
eigvalsh cost: a Rayleigh quotient gives ``lam_lo <= lambda_max`` and hence ``tol_lo <= tol``; if the
Cholesky factorisation of ``G - (tol_lo^2 - gamma) I`` fails, then lambda_min(G) < tol_lo^2 <= tol^2.
``gamma`` is Demmel's bound on how far from singular a matrix can be and still break Cholesky in
floating point (k (k + 1) u max_i g_ii), plus the error of forming G. Subsets proven dependent this way
get rank -1 (unknown below k) and margin NaN, except the first ``exact_dependent`` of them, whose exact
ranks come from stages 2 and 3. This matters at k = d (general position), where the k x k spectra
cost ten times a Cholesky factorisation and most subsets of real tokens are dependent.
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
    many matrices each stage decided. A matrix proven rank-deficient without an exact rank (stage 1b)
    has rank -1 and margin NaN."""

    rank: torch.Tensor
    margin: torch.Tensor
    stages: dict[str, int]


def _shifted_cholesky(gram: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cholesky_ex(G - s I)`` for a batch ((t, k, k), shifts (t,)) without copying G: the diagonal is
    shifted in place and restored bit for bit afterwards."""
    diag = gram.diagonal(dim1=-2, dim2=-1)  # (t, k) view
    saved = diag.clone()
    diag.sub_(shift[:, None])
    try:
        return torch.linalg.cholesky_ex(gram)
    finally:
        diag.copy_(saved)


def _gram_error(gram: torch.Tensor, lam_hi: torch.Tensor, width: int) -> torch.Tensor:
    """Bound on the float64 error of forming and factoring each Gram matrix: (c,)."""
    k = gram.shape[-1]
    return _GUARD * (k + width) * _F64_EPS * lam_hi


def decide(
    gram: torch.Tensor,
    rows,
    rtol: float,
    width: int,
    *,
    lam_cap: float | None = None,
    exact_dependent: int | None = None,
    dependent_first: bool = False,
) -> Decisions:
    """Ranks and margins of c matrices given their Gram matrices.

    Args:
        gram: (c, k, k) float64 Gram matrices X_S X_S^T.
        rows: callable taking a LongTensor of positions in 0..c-1 and returning the matching (c', k, d)
            float64 matrices X_S (only called for the few that need the exact SVD).
        rtol: relative tolerance (singular values above ``rtol * sigma_max`` count).
        width: d, the row width (enters the float64 error bound of the Gram route).
        lam_cap: a known upper bound on every lambda_max, e.g. sigma_1^2 of the pool the rows come
            from (interlacing); tightens stage 1.
        exact_dependent: None to compute the exact rank of every matrix; an integer to prove rank
            deficiency by stage 1b and compute exact ranks for at most this many of those matrices.
        dependent_first: run stage 1b before stage 1 (pays off when most matrices are dependent).
    """
    c, k, _ = gram.shape
    device = gram.device
    rank = torch.full((c,), k, dtype=torch.int64, device=device)
    margin = torch.full((c,), math.inf, dtype=torch.float64, device=device)
    stages = {"cholesky": 0, "cholesky_dependent": 0, "eigvalsh": 0, "svd": 0}
    if c == 0:
        return Decisions(rank, margin, stages)

    diag = gram.diagonal(dim1=-2, dim2=-1)  # (c, k)
    trace = diag.sum(-1)
    gersh = torch.linalg.vector_norm(gram, ord=1, dim=-1).amax(-1)  # largest absolute row sum
    lam_hi = torch.minimum(trace, gersh)  # >= lambda_max
    if lam_cap is not None:
        lam_hi = lam_hi.clamp(max=lam_cap * (1 + 64 * k * _F64_EPS))
    todo = torch.arange(c, device=device)
    prove = exact_dependent is not None and k > 1

    def part(a: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # no copy while nothing is decided
        return a if pos.numel() == c else a[pos]

    budget = exact_dependent or 0

    def stage_dependent(todo: torch.Tensor) -> torch.Tensor:
        # Stage 1b: prove rank deficiency by a failing Cholesky factorisation.
        nonlocal budget
        dep = _prove_dependent(part(gram, todo), part(lam_hi, todo), rtol, width)  # (t,) bool
        proven = todo[dep]
        stages["cholesky_dependent"] += int(proven.numel())
        rank[proven] = -1
        margin[proven] = math.nan
        exact = proven[:budget]
        if exact.numel():  # exact ranks for the histogram: eigenvalues (SVD inside the error band)
            _stage_exact(gram[exact], exact, rows, lam_hi[exact], rtol, width, rank, margin, stages)
            budget -= int(exact.numel())
        return todo[~dep]

    if prove and dependent_first:
        todo = stage_dependent(todo)
    if todo.numel():
        todo = _stage_certify(part(gram, todo), todo, part(lam_hi, todo), rtol, width, rank, margin, stages)
    if prove and not dependent_first and todo.numel():
        todo = stage_dependent(todo)
    if todo.numel():
        _stage_exact(part(gram, todo), todo, rows, part(lam_hi, todo), rtol, width, rank, margin, stages)
    return Decisions(rank, margin, stages)


def _stage_certify(gram, todo, lam_hi, rtol, width, rank, margin, stages) -> torch.Tensor:
    """Stage 1: Cholesky of G - s I succeeds  =>  lambda_min(G) > s >= tol^2 (full rank, margin
    bound written into ``margin``). Returns the positions it could not certify."""
    k = gram.shape[-1]
    delta = _gram_error(gram, lam_hi, width)
    tol_hi2 = rtol**2 * lam_hi  # (t,) >= tol^2
    shift = tol_hi2 + 2 * delta
    eye = torch.eye(k, dtype=gram.dtype, device=gram.device)
    chol, info = _shifted_cholesky(gram, shift)  # (t, k, k), (t,)
    certified = (info == 0) & (lam_hi > 0)
    if bool(certified.any()):
        # Certified margin: lambda_min(G - sI) >= 1 / trace((G - sI)^-1) = 1 / |L^-1|_F^2, so
        # sigma_k^2 >= s + 1 / |L^-1|_F^2 and tol^2 <= tol_hi^2.
        lc = chol if bool(certified.all()) else chol[certified]  # no copy in the common case
        inv = torch.linalg.solve_triangular(lc, eye.expand_as(lc), upper=False)  # (c', k, k) = L^-1
        lam_lo = shift[certified] - 2 * delta[certified] + 1.0 / torch.linalg.vector_norm(inv, dim=(-2, -1)) ** 2
        tiny = torch.finfo(gram.dtype).tiny
        margin[todo[certified]] = 0.5 * torch.log10(lam_lo / tol_hi2[certified].clamp(min=tiny))
    stages["cholesky"] += int(certified.sum())
    return todo[~certified]


def _stage_exact(gram, todo, rows, lam_hi, rtol, width, rank, margin, stages) -> None:
    """Stage 2 (eigenvalues of G) and stage 3 (float64 SVD of X_S where stage 2 is ambiguous)."""
    lam = torch.linalg.eigvalsh(gram).flip(-1).clamp(min=0)  # (t, k) descending
    lam_max = lam[:, 0]
    tol2 = rtol**2 * lam_max
    err = _gram_error(gram, lam_hi, width)
    ambiguous = ((lam - tol2[:, None]).abs() <= 2 * err[:, None]).any(-1) & (lam_max > 0)
    sv = lam.sqrt()
    r2, m2 = margins_from_singular_values(sv, rtol * sv[:, 0])
    ok = ~ambiguous
    rank[todo[ok]] = r2[ok]
    margin[todo[ok]] = m2[ok]
    stages["eigvalsh"] += int(ok.sum())
    hard = todo[ambiguous]
    if hard.numel():
        sv3 = torch.linalg.svdvals(rows(hard))  # (h, k)
        rank[hard], margin[hard] = margins_from_singular_values(sv3, rtol * sv3[:, 0])
        stages["svd"] += int(hard.numel())


def _prove_dependent(gram: torch.Tensor, lam_hi: torch.Tensor, rtol: float, width: int) -> torch.Tensor:
    """(t,) bool: True where lambda_min(G) < (rtol sigma_max)^2 is proven by a failing Cholesky.

    lam_lo: the largest of the diagonal and a Rayleigh quotient after a few power steps (both
    <= lambda_max, so tol_lo <= tol). Cholesky of A = G - s I fails in floating point only when
    lambda_min(A) <= k (k + 1) u max_i a_ii (Demmel); the shift s leaves that much room, plus the error
    of forming G, below tol_lo^2.
    """
    t, k, _ = gram.shape
    diag = gram.diagonal(dim1=-2, dim2=-1)  # (t, k)
    v = torch.ones(t, k, 1, dtype=gram.dtype, device=gram.device)
    for _ in range(4):  # power steps towards the top eigenvector
        v = gram @ v
        v = v / v.norm(dim=1, keepdim=True).clamp(min=torch.finfo(gram.dtype).tiny)
    rayleigh = (v.transpose(1, 2) @ gram @ v)[:, 0, 0]  # (t,) unit v: <= lambda_max up to rounding
    lam_lo = torch.maximum(diag.amax(-1), rayleigh) * (1 - 4 * k * _F64_EPS)
    gamma = 2 * k * (k + 1) * _F64_EPS * diag.amax(-1) + 2 * _gram_error(gram, lam_hi, width)
    shift = rtol**2 * lam_lo - gamma  # (t,)
    _, info = _shifted_cholesky(gram, shift.clamp(min=0))
    return (info != 0) & (shift > 0)


def chunk_size(k: int, d: int, budget_bytes: int = 256 * 2**20) -> int:
    """How many k x k (plus k x d for the fallback) float64 matrices fit in the memory budget."""
    per = 8 * (3 * k * k + k * d)
    return max(1, budget_bytes // per)


def subset_decisions(
    vectors64: torch.Tensor,
    subsets: torch.Tensor,
    rtol: float,
    pool_gram: torch.Tensor | None,
    *,
    lam_cap: float | None = None,
    exact_dependent: int | None = None,
) -> Decisions:
    """Decide every k-subset of a pool.

    Args:
        vectors64: (N, d) float64 pool.
        subsets: (S, k) int64 row indices.
        pool_gram: (N, N) float64 Gram of the whole pool, or None to form each subset's Gram by bmm.
        lam_cap: sigma_1^2 of the pool (bounds every subset's lambda_max), or None.
        exact_dependent: see :func:`decide`; a budget shared by all chunks.
    """
    s, k = subsets.shape
    d = vectors64.shape[1]
    step = chunk_size(k, d)
    parts = []
    budget = exact_dependent
    dependent_first = False
    for start in range(0, s, step):
        idx = subsets[start : start + step]  # (c, k)
        if pool_gram is not None:
            gram = pool_gram[idx[:, :, None], idx[:, None, :]]  # (c, k, k)
        else:
            x = vectors64[idx]  # (c, k, d)
            gram = x @ x.transpose(1, 2)  # (c, k, k)
        dec = decide(gram, lambda pos, idx=idx: vectors64[idx[pos]], rtol, d, lam_cap=lam_cap,
                     exact_dependent=budget, dependent_first=dependent_first)
        if budget is not None:
            budget = max(0, budget - min(budget, dec.stages["cholesky_dependent"]))
            # most of this chunk dependent: try the dependence proof first on the next one
            dependent_first = 2 * dec.stages["cholesky_dependent"] > idx.shape[0]
        parts.append(dec)
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
