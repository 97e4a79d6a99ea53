"""Kruskal lower bounds that survive strongly correlated vectors: Gershgorin (coherence and Babel)
bounds after a whitening map, and a null-space bound from one linear program per vector.

Why. Trained transformer tokens share a dominant mean direction, so the cosines of the raw vectors are
all near 1 (mutual coherence ~0.999) and the plain coherence and Babel bounds of
:func:`probes.kruskal_lower_bound` prove Kruskal rank >= 2 and nothing more. The Kruskal rank (which
subsets are independent) does not change under an invertible linear map or a rescaling of each
vector, but the cosines do, and so do the bounds. The NUMERICAL Kruskal rank, however, is not
invariant: a k-subset S of the rows of X (N, d) is full rank at rtol when
``sigma_k(X_S) > rtol * sigma_1(X_S)`` (the rule of :func:`probes.numerical_rank`), and a map that
helps the cosines can hurt the singular-value ratio. Both bounds below therefore carry the map's
distortion into the inequality they prove, and each proves the statement the project means:

    every subset S with |S| <= lower has sigma_|S|(X_S) > rtol * sigma_1(X_S), i.e. numerical rank |S|.

Notation. x_i are the rows of X, F_k = sqrt(sum of the k largest |x_i|^2), and
``den_k >= sigma_1(X_S)`` for every k-subset S: the smaller of F_k (at least the Frobenius norm of X_S)
and sigma_1(X) (interlacing for a submatrix of rows). A sharper den_k, the smallest over m of
``sqrt((sum of the k largest |x_i P_m|^2) + s_{m+1}^2)`` with P_m the projector on the top m right
singular vectors, lowered den_k by up to 15% at k <= 40 on real tokens yet changed no bound on 24 token
pools (MiniLM and ViT, N = 300 and 1000), so it is not computed. ``rtol_k`` is the tolerance of
k-subsets plus ``64 (k + d) eps`` of float64, the allowance that makes a bound hold for the float64 SVD
verdicts as well as for exact singular values (as in :mod:`probes.bounds`).

(1) Whitened Gershgorin bounds (:func:`whitened_bound`). For ANY A (d, p) and any k-subset S,
``sigma_k(X_S A) <= sigma_k(X_S) ||A||_2`` (singular values of a product), so
``sigma_k(X_S) >= sigma_k(Y_S) / ||A||_2`` with Y = X A. Write Y_S = D_S Z_S, D_S the row norms and
Z_S the unit rows; Gershgorin on the Gram Z_S Z_S^T (unit diagonal, off-diagonal row sums at most the
Babel function mu_1(k - 1) of the rows of Z, or (k - 1) mu with mu their coherence) gives
``sigma_k(Z_S) >= sqrt(1 - mu_1(k - 1))``, hence

    sigma_k(X_S) / sigma_1(X_S) >= min_i |y_i| sqrt(1 - mu_1(k - 1)) / (||A||_2 den_k),

and every k-subset is full rank when the right side exceeds rtol_k. The maps used are clipped
whitenings A = V diag(f), X = U diag(s) V^T the thin SVD and f_i = min(1, s_c / s_i): directions
stronger than s_c are scaled down to s_c, weaker ones are kept (||A||_2 = max f = 1 up to the
orthonormality error of V, which is measured). c = p - 1 is the full whitening by the sample second
moment (for N <= d it makes the rows of Y orthogonal, and the bound reduces to
sigma_N(X) / den_k); smaller c trade coherence for a larger min |y_i|. A small grid of c is tried
and the best bound kept. Rounding: Y is computed in float64 with error E, ``|e_i| <= d eps |x_i|
||A||_F``; by Weyl ``sigma_k(Y_S) >= sigma_k(Y~_S) - sqrt(k) max|e_i|``, which is subtracted; the
cosines of Y~ carry the allowance of :mod:`probes.bounds`.

(2) Null-space bound (:func:`nullspace_bound`). In exact arithmetic spark(X) >= 1 / alpha with
``alpha = max_j max { v_j : X^T v = 0, ||v||_1 <= 1 }`` (a null vector supported on k indices has
an entry of at least 1/k of its l1 norm). Made valid at rtol with the map A above (any A, e.g. the
identity or the best whitening): suppose a k-subset S is dependent at rtol, and take a unit c supported
on S with ``||X^T c||_2 = sigma_k(X_S) <= rtol_k sigma_1(X_S) <= rtol_k den_k``. Let Y~ = X A + E be the
computed rows, rho_i = |y~_i|, Z = D^{-1} Y~ their unit rows (D = diag(rho)) and w = D c (w_i = rho_i c_i).
Then ``Z^T w = Y~^T c = A^T X^T c + E^T c``, so ``||Z^T w||_2 <= t_k := ||A||_2 rtol_k den_k + sqrt(k)
max|e_i|``. For ANY u_j in R^p (a dual certificate of vector j), with a_j >= ||e_j - Z u_j||_inf and
b_j >= ||u_j||_2,

    |w_j| = |(e_j - Z u_j)^T w + u_j^T Z^T w| <= a_j W + b_j t_k,   W = ||w||_1 > 0.

Put lambda = t_k / W. (i) Summing over S: ``1 <= sum_{j in S} (a_j + lambda b_j)``. (ii) The null vector
cannot concentrate: ``1 = ||c||^2 = sum_{i in S} w_i^2 / rho_i^2 <= W max_{i in S} |w_i| / rho_i^2 <=
W^2 max_{i in S} min(a_i + b_i lambda, 1) / rho_i^2``, so for some i in S, with tau_i = t_k / rho_i,
``lambda <= tau_i`` and ``lambda^2 <= tau_i^2 (a_i + b_i lambda)``, i.e. ``lambda <= kappa_i := min(tau_i,
Lambda_i)``, Lambda_i = tau_i (tau_i b_i + sqrt(tau_i^2 b_i^2 + 4 a_i)) / 2 the positive root. Together:

    1 <= sum_{j in S} (a_j + kappa_S b_j),   kappa_S = max_{i in S} kappa_i.

(iii) The same spread, weighted: with pi_i = |w_i| / W (sum_i pi_i = 1, pi_i <= m_i := min(a_i + b_i
lambda, 1)), ``1 = sum_i w_i^2 / rho_i^2 <= W^2 sum_i pi_i m_i / rho_i^2 <= W^2 H(lambda)``, H(lambda) the
largest ``sum_i pi_i g_i``, g_i = m_i / rho_i^2, over all such pi on all N vectors (a greedy fill by
decreasing g_i): ``lambda^2 <= t_k^2 H(lambda)``. A single short vector (small rho_i) can carry only
m_i of the weight, so this limit, one number for all subsets (:func:`_spread_limit`), is often far below
that vector's own kappa_i. kappa_S may therefore be replaced by min(kappa_S, that limit).
(iv) The map's own shape: for any u, ``|u^T Z^T w| = |(A u)^T X^T c + u^T E^T c| <= ||A u||_2 r_k + ||u||_2
e_k`` with r_k = rtol_k den_k and e_k = sqrt(k) max|e_i|, so every ``b_j t_k`` above may be replaced by
``beta_j := ||A u_j|| r_k + ||u_j|| e_k <= b_j t_k`` (the same steps with lambda = 1 / W, tau_i = 1 / rho_i
and b_j -> beta_j; the code does so). For a clipped whitening ``||A u_j|| = ||f * u_j||`` (times ||V||):
the parts of a certificate along the strong directions, which the map shrank, count at their shrunk size.
Contrapositive: if the largest such sum over all k-subsets is below 1, no k-subset is dependent at rtol.
:func:`_subset_bound` bounds that largest sum: vectors in decreasing order of kappa, each of the first
:data:`SPREAD_LEADERS` taken as the top member of S together with the k - 1 largest terms ranked after it,
every other subset at the next kappa. (ii) is what makes the tolerance small: where the certificates
are good (a_i ~ 0.07), a null vector's entries are each at most ~0.07 of its l1 norm, its l1 norm is
~sqrt(1 / 0.07) times its l2 norm, and kappa_i ~ tau_i sqrt(a_i) is ~4x below tau_i. Earlier forms of
this bound used lambda <= max_i tau_i with the smallest rho over all N vectors, and before that
``max_j (a_j + delta b_j) < 1/k``; for the same certificates both are at least the sum above. The sum
and the tolerances grow with k, so k is certified when every k' <= k passes; the bound is the largest
such k. Every vector first gets a solver-free certificate (its dual vector
against 0 to 8 of its most aligned rows, scaled; :func:`_local_certificates`); then all certificates
are improved at once by first-order steps on a smoothed ``sum_j ||e_j - Z u_j||_inf + kappa_j ||u_j||``
(:func:`_refine_certificates`; these approach the optimal certificate, ``a_j = max { v_j : Z^T v = 0,
||v||_1 <= 1 }`` by LP duality, which one exact linear program per vector would give at several
seconds each for N = 1000); the vectors among the k + 1 largest terms then get a linear program each: u is
sought in the span of the unit vectors g_l: the direction of the vector's current certificate, z_j and
its m = :data:`LP_NEIGHBOURS` most aligned rows, u = sum_l beta_l g_l, minimising ``||e_j - Z u||_inf +
kappa_j sum |beta_l|`` (``||u||_2 <= ||beta||_1``; the current certificate is feasible, so a program never
makes it worse), solved by ``scipy.optimize.linprog(method="highs")`` with row generation (rows added while
the residual over all N rows exceeds the program's value). Nothing the solver returns is trusted: a_j
and b_j are evaluated afterwards in float64 over all N rows, with a rounding allowance, and only they
enter the inequality. LP size: 2 (m + 1) + 1 variables, at most 2 N dense rows (typically a few
hundred).

Cost. The SVD of X (O(N d min(N, d))), per whitening one product X A and one pass over the N x N
cosines (O(N^2 p)). The null-space bound: the solver-free certificates of every vector, five batched
passes of O(N^2 p); the refinement, ``steps`` passes of O(N^2 (p + 32)) (200 steps at N = 1000, d = 384:
about 7 s of one CPU core; fewer steps past :data:`REFINE_WORK`, a fixed count so that the bound does
not depend on the machine); then one small LP per vector among the k + 1 largest terms (tens of
milliseconds each), largest first, until the time cap (``seconds``) or until every one of them has had
its program. Stopped anywhere, the bound is valid (every vector has a certificate), only lower. Not
tried for N > :data:`NULLSPACE_MAX_N` (two N x N matrices are kept).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linprog

EPS64 = torch.finfo(torch.float64).eps
CHUNK_BYTES = 64 * 2**20  # memory of one block of rows of the cosine matrix
BABEL_FIRST_COLUMNS = 128  # the Babel function is first computed for m <= this, then for 4x more, ...
CLIP_QUANTILES = (1.0, 0.9, 0.8, 0.67, 0.5)  # clip index c = round(q p) - 1: the whitenings tried
LP_NEIGHBOURS = 24  # a certificate combines its vector with this many of the most aligned others
LP_ROUNDS = 6  # most rounds of row generation per linear program
NULLSPACE_MAX_N = 4000  # the null-space bound keeps two N x N matrices (cosines and their order)
LOCAL_SIZES = (0, 1, 2, 4, 8)  # the solver-free certificates use this many neighbours (0: coherence)
REFINE_STEPS = 200  # first-order steps that improve every certificate at once (O(N^2 (p + 32)) each)
REFINE_WORK = (
    200 * 1000**2 * (768 + 32)
)  # most N^2 (p + 32) x steps per call: 200 steps up to N = 1000, d = 768
REFINE_MAX_RATIO = 16  # no refinement with more than this many vectors per dimension (alpha stays near 1)
SPREAD_GRID = 64  # cells of the grid that bounds lambda through the weighted spread (_spread_limit)
SPREAD_LEADERS = 32  # vectors of largest cap each taken as the top member of a subset (_subset_bound)
REFINE_BETAS = (
    50.0,
    3200.0,
)  # smoothing of the max: first and last, geometric between (MiniLM block.5: 11 at 800)


@dataclass(frozen=True)
class Cosines:
    """What one pass over the |cosine| matrix found: the Babel function for m = 1..len(babel), the
    coherence and the pairs at or above a threshold (each unordered pair once)."""

    babel: torch.Tensor  # (M,) float64: babel[m - 1] = mu_1(m) as computed
    coherence: float
    pairs_above: int
    pair: tuple[int, int] | None  # the two distinct vectors of largest |cosine| (None for N = 1)


def unit_rows(x64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 unit rows (zero rows stay zero) and the row norms of a float64 (N, d) matrix."""
    norms = torch.linalg.vector_norm(x64, dim=1)  # (N,)
    unit = x64 / torch.where(norms > 0, norms, 1.0)[:, None]  # (N, d)
    return unit, norms


def cosine_pass(unit: torch.Tensor, columns: int, threshold: float | None = None) -> Cosines:
    """Babel function up to m = ``columns``, coherence and pairs with |cosine| >= threshold, from the
    |cosine| matrix in blocks of rows (memory ~ :data:`CHUNK_BYTES`, never the whole N x N at once)."""
    n_vec = unit.shape[0]
    rows_per_block = max(1, CHUNK_BYTES // (8 * n_vec))
    babel = torch.zeros(columns, dtype=torch.float64, device=unit.device)
    coherence, pair = -math.inf, None
    pairs = 0
    for start in range(0, n_vec, rows_per_block):
        rows = torch.arange(start, min(start + rows_per_block, n_vec), device=unit.device)
        cos = (unit[rows] @ unit.T).abs_()  # (b, N)
        cos[torch.arange(rows.numel(), device=unit.device), rows] = -1.0  # below every |cosine|: never picked
        best = int(cos.argmax())
        if float(cos.flatten()[best]) > coherence and n_vec > 1:
            coherence = float(cos.flatten()[best])
            pair = (int(rows[best // n_vec]), best % n_vec)
        if threshold is not None:
            upper = torch.arange(n_vec, device=unit.device)[None, :] > rows[:, None]  # (b, N): j > i
            pairs += int(((cos >= threshold) & upper).sum())
        if columns:
            top = cos.topk(columns, dim=1, sorted=True).values  # (b, columns), descending
            babel = torch.maximum(babel, top.cumsum(dim=1).amax(dim=0))
    return Cosines(babel=babel, coherence=coherence if n_vec > 1 else math.nan, pairs_above=pairs, pair=pair)


def babel_upper(cos: Cosines, width: int) -> torch.Tensor:
    """Rigorous upper bounds on mu_1(m), m = 1..len(cos.babel), of unit rows of width ``width``: each
    cosine carries an error below ``4 (width + 4) eps``, the sums their own summation error."""
    m = torch.arange(1, cos.babel.numel() + 1, dtype=torch.float64, device=cos.babel.device)
    return cos.babel * (1 + 2 * m * EPS64) + m * 4 * (width + 4) * EPS64


def coherence_upper(cos: Cosines, width: int) -> float:
    """A rigorous upper bound on the coherence (see :func:`babel_upper`)."""
    return (cos.coherence + 4 * (width + 4) * EPS64) * (1 + 2 * EPS64)


def first_failure(passes: torch.Tensor, ks: torch.Tensor) -> int:
    """Largest k in ``ks`` (consecutive) up to which ``passes`` holds; ``ks[0] - 1`` when none does."""
    failed = (~passes).nonzero()
    return int(ks[-1]) if failed.numel() == 0 else int(ks[int(failed[0])]) - 1


@dataclass(frozen=True)
class Spectrum:
    """What both bounds share: the thin SVD of the pool and the per-k denominators.

    Attributes:
        x: (N, d) float64 pool (rescaled by a power of two where needed; verdicts are scale-free).
        norms: (N,) row norms.
        u: (N, p), s: (p,), vh: (p, d): thin SVD, p = min(N, d).
        v_norm: an upper bound on ||V||_2 (1 up to the orthonormality error of the computed V).
        den: (top,) den[k - 1] >= sigma_1(X_S) for every k-subset S (rounding included).
        rtol: (top,) rtol[k - 1] = tolerance of k-subsets plus the float64 verdict allowance.
    """

    x: torch.Tensor
    norms: torch.Tensor
    u: torch.Tensor
    s: torch.Tensor
    vh: torch.Tensor
    v_norm: float
    den: torch.Tensor
    rtol: torch.Tensor


def spectrum(x64: torch.Tensor, rtols: list[float]) -> Spectrum:
    """The :class:`Spectrum` of a float64 pool (N, d); ``rtols[k - 1]`` the tolerance of k-subsets."""
    n_vec, d = x64.shape
    top = len(rtols)
    norms = torch.linalg.vector_norm(x64, dim=1)  # (N,)
    u, s, vh = torch.linalg.svd(x64, full_matrices=False)  # (N, p), (p,), (p, d)
    v_norm = float(torch.linalg.svdvals(vh)[0]) * (1 + 64 * d * EPS64)
    ks = torch.arange(1, top + 1, dtype=torch.float64, device=x64.device)
    frob = torch.sqrt(torch.cumsum(norms.sort(descending=True).values[:top] ** 2, 0)) * (
        1 + (d + 2 * ks + 8) * EPS64
    )
    sigma1 = float(s[0]) * (1 + 64 * (n_vec + d) * EPS64)  # float64 SVD: backward stable
    den = torch.clamp(frob, max=sigma1)  # (top,)
    rtol = torch.tensor(rtols, dtype=torch.float64, device=x64.device) + 64 * (ks + d) * EPS64
    return Spectrum(x=x64, norms=norms, u=u, s=s, vh=vh, v_norm=v_norm, den=den, rtol=rtol)


@dataclass(frozen=True)
class Whitened:
    """One clipped whitening Y = X A, A = V diag(f), f_i = min(1, s_c / s_i), as the bounds use it.

    Attributes:
        clip: c (0-based index of the singular value the stronger directions are clipped to).
        unit: (N, p) unit rows Z of the computed Y.
        y_min: a lower bound on min_i |y_i| of the computed Y.
        a_norm: an upper bound on ||A||_2.
        err: an upper bound on max_i |e_i|, the rounding of each row of Y.
        rho: (N,) lower bounds on each |y_i| of the computed Y (y_min is their minimum).
        f: (p,) the diagonal of the map (A = V diag(f) as computed).
    """

    clip: int
    unit: torch.Tensor
    y_min: float
    a_norm: float
    err: float
    rho: torch.Tensor
    f: torch.Tensor


def whiten(sp: Spectrum, clip: int) -> Whitened:
    """The clipped whitening of ``sp`` at singular value index ``clip`` (see the module docstring)."""
    d = sp.x.shape[1]
    f = torch.clamp(sp.s[clip] / sp.s, max=1.0)  # (p,)
    a = sp.vh.T * f  # (d, p)
    y = sp.x @ a  # (N, p)
    unit, ynorm = unit_rows(y)
    p = y.shape[1]
    rho = ynorm * (1 - (p + 8) * EPS64)  # (N,)
    y_min = float(rho.min())
    a_norm = float(f.max()) * sp.v_norm * (1 + 2 * (p + 4) * EPS64)  # A's own rounding included
    err = (d + 2) * EPS64 * float(sp.norms.max()) * float(torch.linalg.matrix_norm(a)) * (1 + 1e-6)
    return Whitened(clip=clip, unit=unit, y_min=y_min, a_norm=a_norm, err=err, rho=rho, f=f)


def clip_grid(sp: Spectrum) -> list[int]:
    """The clip indices tried, strongest whitening first; only singular values above zero. Where the pool
    is numerically rank-deficient (r singular values above ``rtol * sigma_1``, r < p, e.g. tokens after a
    LayerNorm, which lie in a hyperplane), the full whitening of the top-r subspace (c = r - 1) and the
    quantiles of r come first: clipping at a singular value below the tolerance inflates it past use."""
    positive = int((sp.s > 0).sum())
    ranked = int((sp.s > sp.s[0] * sp.rtol[-1]).sum())
    grid = []
    for top in dict.fromkeys(n for n in (ranked, positive) if n > 0):
        for q in CLIP_QUANTILES:
            c = min(top, max(1, round(q * top))) - 1
            if c not in grid:
                grid.append(c)
    return grid


@dataclass(frozen=True)
class WhitenedBound:
    """What the whitened Gershgorin bounds prove (see the module docstring, (1)).

    Attributes:
        coherence_k, babel_k: every k-subset with k <= this is proven full rank (1: nothing beyond
            single vectors), best over the whitenings tried.
        clip: the clip index c of the whitening behind the larger of the two (None if neither passed 2).
        coherence: the coherence of the whitened unit rows for that whitening (NaN when clip is None).
        whitened: that whitening (for the null-space bound; among equal bounds the one with the largest
            min |y_i| / ||A||_2, which loosens the tolerance least), or the full one when none passed.
    """

    coherence_k: int
    babel_k: int
    clip: int | None
    coherence: float
    whitened: Whitened | None


def _ratio_bounds(w: Whitened, bound: torch.Tensor, ks: torch.Tensor, sp: Spectrum) -> torch.Tensor:
    """Which k in ``ks`` pass, given rigorous upper bounds ``bound[i] >= mu_1(ks[i] - 1)`` on the
    Gershgorin radius of the whitened unit rows: the lower bound on sigma_k / sigma_1 exceeds rtol_k."""
    below = bound < 1
    safe = torch.where(below, bound, 0.0)
    sigma_k = w.y_min * torch.sqrt(1 - safe) * (1 - 8 * EPS64) - torch.sqrt(ks.double()) * w.err  # (K,)
    ratio = sigma_k / (w.a_norm * sp.den[ks - 1]) * (1 - 8 * EPS64)
    return below & (ratio > sp.rtol[ks - 1])


def whitened_bound(sp: Spectrum, start: int = 1) -> WhitenedBound:
    """Whitened coherence and Babel bounds of ``sp``, best over :func:`clip_grid`.

    Args:
        sp: the pool's :class:`Spectrum` (``len(sp.rtol)`` = the largest k to certify).
        start: what is proven already (a whitening is only worth its Babel columns beyond it).
    """
    top = sp.rtol.numel()
    best_c = best_b = 1
    best: tuple[tuple[int, float], Whitened, float] | None = None
    full: Whitened | None = None
    if top < 2:
        return WhitenedBound(coherence_k=1, babel_k=1, clip=None, coherence=math.nan, whitened=None)
    ks = torch.arange(2, top + 1, device=sp.x.device)  # (top - 1,)
    for clip in clip_grid(sp):
        w = whiten(sp, clip)
        full = w if full is None else full
        p = w.unit.shape[1]
        columns = min(max(BABEL_FIRST_COLUMNS, 2 * start), top - 1)
        cos = cosine_pass(w.unit, columns)
        while True:
            babel_k = first_failure(_ratio_bounds(w, babel_upper(cos, p), ks[:columns], sp), ks[:columns])
            if babel_k <= columns or columns == top - 1:
                break
            columns = min(4 * columns, top - 1)
            cos = cosine_pass(w.unit, columns)
        mu = coherence_upper(cos, p)
        coherence_k = first_failure(_ratio_bounds(w, (ks - 1).double() * mu, ks, sp), ks)
        best_c = max(best_c, coherence_k)
        key = (max(babel_k, coherence_k), w.y_min / w.a_norm)  # ties: the map that loosens rtol least
        if key[0] > 1 and (best is None or key > best[0]):
            best = (key, w, cos.coherence)
        best_b = max(best_b, babel_k)
        if best_b >= top:
            break
    if best is None:
        return WhitenedBound(coherence_k=best_c, babel_k=best_b, clip=None, coherence=math.nan, whitened=full)
    return WhitenedBound(coherence_k=best_c, babel_k=best_b, clip=best[1].clip, coherence=best[2],
                         whitened=best[1])


@dataclass(frozen=True)
class NullspaceBound:
    """What the null-space bound proves (see the module docstring, (2)).

    Attributes:
        k: every k-subset with k <= this is proven full rank (1: nothing beyond single vectors).
        alpha: max_j (a_j + delta b_j) with delta = delta_{min(k + 1, top)} (an upper bound on alpha
            at that tolerance; NaN when nothing was tried).
        solved: how many linear programs were solved (beyond the solver-free certificates).
        complete: every vector got a certificate (False only when the tolerance ruled the bound out).
        note: why the programs stopped early, if they did.
    """

    k: int
    alpha: float
    solved: int
    complete: bool
    note: str = ""


def _tolerances(sp: Spectrum, w: Whitened) -> tuple[torch.Tensor, torch.Tensor]:
    """(top,) r_k and e_k: a k-subset S dependent at rtol has a unit c supported on S with ||X^T c||_2 <= r_k
    and ||E^T c||_2 <= e_k (E the rounding of Y), so ``|u^T Y^T c| <= ||A u|| r_k + ||u|| e_k`` for any u
    (module docstring, (2))."""
    ks = torch.arange(1, sp.rtol.numel() + 1, dtype=torch.float64, device=sp.x.device)
    return sp.rtol * sp.den * (1 + 16 * EPS64), torch.sqrt(ks) * w.err * (1 + 16 * EPS64)


def _map_norms(u: torch.Tensor, w: Whitened, v_norm: float) -> torch.Tensor:
    """Upper bounds on ||A u_j||_2 for certificates u (..., p): ``||V diag(f) u|| <= ||V|| ||f * u||``, plus
    the rounding of the computed A (each entry within eps of V_ij f_j) and of the norm."""
    p = u.shape[-1]
    fu = torch.linalg.vector_norm(u * w.f, dim=-1) * v_norm * (1 + 2 * (p + 4) * EPS64)
    return fu + (p + 8) * EPS64 * v_norm * float(w.f.max()) * torch.linalg.vector_norm(u, dim=-1)


def _taus(t_k: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """(N,) tau_i = t_k / rho_i rounded up: the tolerance of one k, per vector."""
    return t_k / rho * (1 + 4 * EPS64)


def _caps(a: torch.Tensor, b: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """(N,) kappa_i = min(tau_i, Lambda_i), Lambda_i the positive root of ``lam^2 = tau_i^2 (a_i + b_i lam)``,
    rounded up: a dependent subset S has lambda <= max_{i in S} kappa_i (module docstring, (2))."""
    tb = tau * b
    lam = tau * (tb + torch.sqrt(tb * tb + 4 * a)) / 2
    return torch.minimum(tau, lam * (1 + 64 * EPS64))


def _spread_limit(a: torch.Tensor, b: torch.Tensor, t_k: float, rho: torch.Tensor) -> float:
    """An upper bound on every lambda with ``lambda^2 <= t_k^2 H(lambda)``, H the largest ``sum_i pi_i g_i``
    over 0 <= pi_i <= m_i, sum_i pi_i = 1 (all N vectors), m_i = min(a_i + b_i lambda, 1), g_i = m_i /
    rho_i^2 (module docstring, (iii)). H increases with lambda, so a cell [l_j, l_{j+1}] of a grid holds no
    such lambda when ``l_j^2 > t_k^2 H(l_{j+1})``; the bound is the top of the highest cell that is not
    excluded. The grid spans [0, l_up], l_up from H <= max_i g_i <= max (a_i + b_i lambda) / rho_i^2."""
    n_vec = a.numel()
    inv = (1 / rho**2) * (1 + 4 * EPS64)  # (N,)
    coef_a, coef_b = float((a * inv).max()), float((b * inv).max())
    t2 = t_k * t_k
    l_up = (t2 * coef_b + math.sqrt(t2 * t2 * coef_b**2 + 4 * t2 * coef_a)) / 2 * (1 + 64 * EPS64)
    lams = torch.linspace(0, l_up, SPREAD_GRID + 1, dtype=torch.float64, device=a.device)  # (L,)
    m = torch.clamp(a[None, :] + lams[:, None] * b[None, :], max=1.0)  # (L, N)
    g = m * inv[None, :]  # (L, N)
    g_s, order = g.sort(dim=1, descending=True)
    caps = m.gather(1, order)  # (L, N): caps in decreasing order of g
    before = caps.cumsum(dim=1) - caps  # (L, N): caps of the vectors before each
    share = torch.clamp(torch.minimum(caps, 1 - before), min=0.0)  # (L, N): the greedy fill
    h = (share * g_s).sum(dim=1) * (1 + 4 * (n_vec + 4) * EPS64)  # (L,)
    h = torch.where(caps.sum(dim=1) >= 1 - 4 * n_vec * EPS64, h, -math.inf)  # no pi: (i) fails there
    open_cells = (lams[:-1] ** 2 <= t2 * h[1:] * (1 + 4 * EPS64)).nonzero()
    return float(lams[int(open_cells[-1]) + 1]) if open_cells.numel() else 0.0


def _terms(a: torch.Tensor, b: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """(N,) a_i + kappa_i b_i: what vector i adds to the sum when its own cap decides (used to pick the
    certificates to improve; the proof is :func:`_subset_bound`)."""
    return a + _caps(a, b, tau) * b


def _certificate(z: np.ndarray, cos_j: np.ndarray, j: int, delta: float,
                 start: np.ndarray | None = None, scale: np.ndarray | None = None) -> np.ndarray:
    """A dual certificate u (p,) for vector j: the minimiser of ``||e_j - Z u||_inf + delta sum_l |beta_l|
    ||scale * g_l||`` (an upper bound on ``delta ||scale * u||``; scale None: ones) over u = sum_l beta_l
    g_l, the unit vectors g_l being z_j, its :data:`LP_NEIGHBOURS` most aligned vectors and, if given,
    the direction of the certificate ``start`` (p,) that u improves on. One linear program, variables
    beta+, beta- (m each) and t, rows 2 N (dense N x m); ``start`` (or u = z_j / (1 + mu_j)) is feasible,
    so the certificate is never worse than it (or than the coherence of row j)."""
    n_vec = z.shape[0]
    near = np.argsort(-np.abs(cos_j), kind="stable")
    local = np.concatenate([[j], near[near != j][:LP_NEIGHBOURS]])  # (m,)
    basis = z[local]  # (m, p)
    e = np.zeros(n_vec)
    e[j] = 1.0
    if start is not None and float(np.linalg.norm(start)) > 0:
        basis = np.vstack([basis, start / np.linalg.norm(start)])
        u = start
    else:
        u = z[j] / (1 + float(np.abs(cos_j).max(initial=0.0)))  # the coherence certificate of row j
    cl = z @ basis.T  # (N, m)
    m1 = basis.shape[0]
    scale = np.ones(z.shape[1]) if scale is None else scale
    first = np.abs(e - z @ u)  # (N,)
    best = float(first.max()) + delta * float(np.linalg.norm(scale * u))
    weights = delta * np.linalg.norm(basis * scale, axis=1)  # (m,)
    cost = np.concatenate([weights, weights, [1.0]])  # beta+, beta-, t
    # rows generated: the largest residuals of the starting point and the rows of largest |cosine| with
    # the local vectors first, then the violated ones
    rows = np.union1d(np.argsort(-np.abs(cl).max(axis=1), kind="stable")[:8 * m1], local)
    rows = np.union1d(rows, np.argsort(-first, kind="stable")[:4 * m1])
    for _ in range(LP_ROUNDS):
        cr = cl[rows]  # (R, m)
        ones = np.ones((rows.size, 1))
        a_ub = np.block([[cr, -cr, -ones], [-cr, cr, -ones]])  # (2R, 2 m + 1)
        sol = linprog(cost, A_ub=a_ub, b_ub=np.concatenate([e[rows], -e[rows]]), bounds=(0, None),
                      method="highs")
        if sol.status != 0 or sol.x is None:
            break
        beta = sol.x[:m1] - sol.x[m1:2 * m1]
        resid = np.abs(e - cl @ beta)  # (N,)
        found = basis.T @ beta
        value = float(resid.max()) + delta * float(np.linalg.norm(scale * found))
        if value < best:  # the best certificate met so far (a round may fit its rows but not all N)
            u, best = found, value
        over = np.flatnonzero(resid > sol.x[-1] * (1 + 1e-9) + 1e-12)
        if over.size == 0:
            break
        rows = np.union1d(rows, over[np.argsort(-resid[over], kind="stable")][:4 * m1])
    return u


def _local_certificates(z: torch.Tensor, order: torch.Tensor, m: int) -> torch.Tensor:
    """(N, p) certificates without a solver: u_j is the dual vector of z_j against its m most aligned
    rows L (``<z_l, u0> = 0`` for l in L, ``<z_j, u0> = 1``; u0 = Z_L^T (Z_L Z_L^T)^-1 e_1), scaled by
    1 / (1 + c_j), c_j = max_{i != j} |<z_i, u0>|, which balances the two sides of ``||e_j - Z u||_inf``.
    m = 0 is the coherence certificate of row j. Rows in blocks (memory ~ :data:`CHUNK_BYTES`)."""
    n_vec, p = z.shape
    out = torch.empty_like(z)
    block = max(1, CHUNK_BYTES // (8 * max(n_vec, (m + 1) * p)))
    eye = torch.eye(m + 1, dtype=z.dtype, device=z.device)
    for lo in range(0, n_vec, block):
        js = torch.arange(lo, min(lo + block, n_vec), device=z.device)
        local = torch.cat([js[:, None], order[js, :m]], dim=1)  # (b, m + 1)
        zl = z[local]  # (b, m + 1, p)
        gram = zl @ zl.transpose(1, 2)  # (b, m + 1, m + 1)
        rhs = eye[:, :1].expand(js.numel(), m + 1, 1)
        coef = torch.linalg.lstsq(gram, rhs).solution  # (b, m + 1, 1); least squares: Gram may be singular
        u0 = (zl.transpose(1, 2) @ coef)[..., 0]  # (b, p)
        corr = z @ u0.T  # (N, b)
        corr[js, torch.arange(js.numel(), device=z.device)] = 0.0
        out[js] = u0 / (1 + corr.abs().amax(dim=0))[:, None]
    return out


def _evaluate(z: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rigorous (a_j, b_j) of certificates u (N, p) for the unit rows z (N, p): ``a_j >=
    ||e_j - Z u_j||_inf`` of the exact unit rows, ``b_j >= ||u_j||_2`` (rounding allowances included)."""
    n_vec, p = z.shape
    b = torch.linalg.vector_norm(u, dim=1) * (1 + p * EPS64)  # (N,)
    a = torch.empty(n_vec, dtype=torch.float64, device=z.device)
    block = max(1, CHUNK_BYTES // (8 * n_vec))
    for lo in range(0, n_vec, block):
        js = torch.arange(lo, min(lo + block, n_vec), device=z.device)
        resid = -(z @ u[js].T)  # (N, b): e_j - Z u_j
        resid[js, torch.arange(js.numel(), device=z.device)] += 1.0
        a[js] = resid.abs().amax(dim=0)
    allowance = 2 * (p + 8) * EPS64  # rounding of Z u and of the unit rows, per unit of ||u||_2
    return a + allowance * b + 2 * EPS64, b


def _subset_bound(a: torch.Tensor, b: torch.Tensor, kappa: torch.Tensor, k: int) -> float:
    """A rigorous upper bound on ``max_S sum_{j in S} (a_j + kappa_S b_j)`` over the k-subsets S of the N
    vectors, kappa_S = max_{i in S} kappa_i (all (N,), 2 <= k <= N). Vectors in decreasing order of
    kappa: the :data:`SPREAD_LEADERS` first are each taken as the top member of S, with the k - 1 largest
    terms ranked after it at its kappa; every other subset lies in the rest, at the next kappa."""
    n_vec = a.numel()
    order = kappa.argsort(descending=True, stable=True)
    a_s, b_s, k_s = a[order], b[order], kappa[order]  # (N,) each, kappa descending
    lead = min(SPREAD_LEADERS, n_vec - k + 1)  # the top member of a k-subset ranks at most N - k
    ranks = torch.arange(n_vec, device=a.device)
    vals = a_s[None, :] + k_s[:lead, None] * b_s[None, :]  # (lead, N): row m at the kappa of rank m
    vals = vals.masked_fill(ranks[None, :] <= ranks[:lead, None], -math.inf)  # only members ranked after m
    best = float((a_s[:lead] + k_s[:lead] * b_s[:lead] + vals.topk(k - 1, dim=1).values.sum(dim=1)).max())
    if lead < n_vec - k + 1:  # subsets of the vectors ranked lead and later
        best = max(best, float((a_s[lead:] + k_s[lead] * b_s[lead:]).topk(k).values.sum()))
    return best * (1 + 2 * (k + 2) * EPS64)


def _largest_k(a: torch.Tensor, bt: torch.Tensor, rho: torch.Tensor) -> int:
    """Largest k such that every k' <= k is proven: ``_subset_bound`` of the certificates at their caps is
    below 1 (module docstring, (2)); ``bt`` (top, N): row k - 1 the tolerance term of each vector for
    k-subsets (``||A u_j|| r_k + ||u_j|| e_k``), ``rho`` (N,). 1 when k = 2 fails."""
    top = min(bt.shape[0], a.numel())
    tau = _taus(torch.ones((), dtype=rho.dtype, device=rho.device), rho)  # (N,): 1 / rho_i
    k = 1
    while k < top:
        kappa = _caps(a, bt[k], tau)  # for k + 1
        if _subset_bound(a, bt[k], kappa, k + 1) >= 1.0:  # the weighted limit only where the caps fail
            kappa = torch.clamp(kappa, max=_spread_limit(a, bt[k], 1.0, rho))
            if _subset_bound(a, bt[k], kappa, k + 1) >= 1.0:
                break
        k += 1
    return k


def nullspace_bound(sp: Spectrum, w: Whitened, *, start: int, seconds: float,
                    steps: int = REFINE_STEPS) -> NullspaceBound:
    """The null-space bound of the pool in the coordinates of the whitening ``w`` (module docstring, (2)).

    Every vector first gets the best of :data:`LOCAL_SIZES` solver-free certificates
    (:func:`_local_certificates`); then the vectors that hold the bound down get a linear program each,
    worst first, while ``seconds`` allows and while one more can still raise the bound. The bound is
    valid whenever it stops (each vector always has a certificate).

    Args:
        sp: the pool's :class:`Spectrum`.
        w: the map A (any; the best whitening is a good choice).
        start: what other bounds prove already (the programs aim above it).
        seconds: wall-time cap for the linear programs (0: none).
        steps: first-order refinement steps for all certificates at once (:func:`_refine_certificates`;
            0: none). A step count, not a time, so that the bound does not depend on the machine; at most
            ``REFINE_WORK / (N^2 (p + 32))`` of them, none for N > :data:`REFINE_MAX_RATIO` p.
    """
    top = sp.rtol.numel()
    r, e = _tolerances(sp, w)  # (top,) each
    z, rho = w.unit, w.rho  # (N, p), (N,)
    n_vec = z.shape[0]
    if top < 2 or float(w.a_norm * r[1] + e[1]) >= float(rho.max()):  # every tau_i >= 1: k = 2 fails
        return NullspaceBound(k=1, alpha=math.nan, solved=0, complete=False,
                              note="the tolerance alone keeps it below 2")
    if n_vec > NULLSPACE_MAX_N:
        return NullspaceBound(k=1, alpha=math.nan, solved=0, complete=False,
                              note=f"not tried for N = {n_vec} > {NULLSPACE_MAX_N} vectors (N x N work)")
    cos = z @ z.T  # (N, N)
    cos.fill_diagonal_(0.0)
    order = cos.abs().argsort(dim=1, descending=True)  # (N, N): the most aligned rows first
    target = min(top, max(start + 1, 2))
    tau = _taus(torch.ones((), dtype=rho.dtype, device=rho.device), rho)  # (N,): 1 / rho_i

    def coef(b: torch.Tensor, b2: torch.Tensor, k: int) -> torch.Tensor:  # (N,): tolerance terms for k
        return b2 * r[k - 1] + b * e[k - 1]

    def coefs(b: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:  # (top, N): every k
        return r[:, None] * b2[None, :] + e[:, None] * b[None, :]

    a = b = b2 = u = None
    for m in LOCAL_SIZES:
        if m >= n_vec:
            break
        um = _local_certificates(z, order, m)
        am, bm = _evaluate(z, um)
        b2m = _map_norms(um, w, sp.v_norm)
        if a is None:
            a, b, b2, u = am, bm, b2m, um
        else:
            better = _terms(am, coef(bm, b2m, target), tau) < _terms(a, coef(b, b2, target), tau)
            a, b = torch.where(better, am, a), torch.where(better, bm, b)
            b2, u = torch.where(better, b2m, b2), torch.where(better[:, None], um, u)
    p = z.shape[1]
    steps = min(steps, REFINE_WORK // (n_vec**2 * (p + 32))) if n_vec <= REFINE_MAX_RATIO * p else 0
    if steps > 0 and _largest_k(a, coefs(b, b2), rho) < min(top, n_vec):  # refine every certificate at once
        weight = _caps(a, coef(b, b2, target), tau) * r[target - 1] * sp.v_norm  # (N,): on ||f * u_j||
        ur = _refine_certificates(z, u, weight, steps, w.f)
        ar, br = _evaluate(z, ur)
        b2r = _map_norms(ur, w, sp.v_norm)
        better = _terms(ar, coef(br, b2r, target), tau) < _terms(a, coef(b, b2, target), tau)
        a, b = torch.where(better, ar, a), torch.where(better, br, b)
        b2, u = torch.where(better, b2r, b2), torch.where(better[:, None], ur, u)
    k = _largest_k(a, coefs(b, b2), rho)
    # linear programs for the vectors among the k + 1 largest terms, largest first
    t0 = time.perf_counter()  # the cap is on the programs alone
    zn, cn, fn = z.cpu().numpy(), cos.cpu().numpy(), w.f.cpu().numpy()
    solved, note = 0, ""
    tried = torch.zeros(n_vec, dtype=torch.bool, device=z.device)
    while seconds > 0 and k < min(top, n_vec):
        spent = time.perf_counter() - t0
        if spent > seconds:
            note = f"linear programs stopped at the {seconds:g} s cap after {solved}"
            break
        ck = coef(b, b2, k + 1)  # proving k + 1: the terms at its tolerance
        value = _terms(a, ck, tau)
        largest = value.topk(k + 1).indices
        untried = largest[~tried[largest]]
        if untried.numel() == 0:
            break  # every vector among the k + 1 largest has had its program
        j = int(untried[0])
        weight = float(_caps(a[j:j + 1], ck[j:j + 1], tau[j:j + 1])[0]) * float(r[k]) * sp.v_norm
        uj = torch.as_tensor(_certificate(zn, cn[j], j, weight, u[j].cpu().numpy(), fn), device=z.device)
        aj, bj = _evaluate_one(z, uj, j)
        b2j = float(_map_norms(uj, w, sp.v_norm))
        solved += 1
        tried[j] = True
        one = torch.tensor([aj, bj, b2j], dtype=a.dtype, device=a.device)
        if float(_terms(one[:1], coef(one[1:2], one[2:3], k + 1), tau[j:j + 1])[0]) < float(value[j]):
            a[j], b[j], b2[j], u[j] = aj, bj, b2j, uj
        k = _largest_k(a, coefs(b, b2), rho)
    alpha = float(_terms(a, coef(b, b2, min(k + 1, top)), tau).max())
    return NullspaceBound(k=k, alpha=alpha, solved=solved, complete=True, note=note)


def _evaluate_one(z: torch.Tensor, u: torch.Tensor, j: int) -> tuple[float, float]:
    """:func:`_evaluate` for one certificate u (p,) of row j."""
    p = z.shape[1]
    b = float(torch.linalg.vector_norm(u)) * (1 + p * EPS64)
    resid = -(z @ u)  # (N,)
    resid[j] += 1.0
    return float(resid.abs().max()) + 2 * (p + 8) * EPS64 * b + 2 * EPS64, b


def _refine_certificates(z: torch.Tensor, u: torch.Tensor, delta: torch.Tensor, steps: int,
                         scale: torch.Tensor) -> torch.Tensor:
    """Better certificates for every row at once: ``steps`` Adam steps on the smoothed objective
    ``sum_j smax_beta |e_j - Z u_j| + delta_j ||scale * u_j||_2`` (``delta`` (N,): each row's weight;
    smax_beta(r) = log sum_l (e^{beta r_l} + e^{-beta r_l}) / beta, within log(2N) / beta of the max),
    beta rising geometrically over :data:`REFINE_BETAS`, in float32 from the certificates ``u`` (N, p).
    Returns (N, p) float64, for each row the best iterate met (measured every 10 steps). Nothing here needs
    to be exact: the caller keeps a row's new certificate only where its rigorous :func:`_evaluate` is
    better. Work per step: two (N, N, p) products; memory a few N x N float32 blocks."""
    n_vec = z.shape[0]
    zf = z.float()  # (N, p)
    param = u.float().clone()  # (N, p)
    opt = torch.optim.Adam([param.requires_grad_(False)])
    eye = torch.eye(n_vec, dtype=zf.dtype, device=zf.device)
    best, best_val = u.clone(), torch.full((n_vec,), math.inf, dtype=zf.dtype, device=zf.device)
    lo, hi = REFINE_BETAS
    delta, scale = delta.to(zf.dtype), scale.to(zf.dtype)  # (N,), (p,)
    for step in range(steps + 1):
        resid = eye - param @ zf.T  # (N, N): row j is e_j - Z u_j
        norm = torch.linalg.vector_norm(param * scale, dim=1)  # (N,)
        peak = resid.abs().amax(dim=1, keepdim=True)  # (N, 1)
        if step % 10 == 0 or step == steps:
            val = peak[:, 0] + delta * norm
            better = val < best_val
            best_val = torch.where(better, val, best_val)
            best[better] = param[better].double()
        if step == steps:
            break
        beta = lo * (hi / lo) ** (step / max(1, steps - 1))
        plus, minus = torch.exp(beta * (resid - peak)), torch.exp(beta * (-resid - peak))  # (N, N) each
        weight = (plus - minus) / (plus + minus).sum(dim=1, keepdim=True)  # (N, N): d smax / d resid
        param.grad = -(weight @ zf) + (delta / norm.clamp_min(1e-30))[:, None] * param * scale**2  # (N, p)
        for group in opt.param_groups:
            group["lr"] = 0.5 / beta
        opt.step()
    return best
