"""Fast batched full-rank decisions for many small matrices (k rows of width d, k <= d).

The question asked of every k x d matrix X_S (a k-subset of a pool, or one context) is whether its
smallest singular value sigma_k exceeds ``tol = rtol * sigma_max``; when it does not, its rank. The
answer must equal the float64 SVD answer at the same tolerance. With G = X_S X_S^T, sigma_k^2 =
lambda_min(G) and sigma_max^2 = lambda_max(G). Each stage below decides only what it can prove.

0. float32 certificate (k-subsets of a pool, CPU). A shifted Cholesky factorisation in float32 of the
   subset's block of the pool Gram, the shift raised by a bound on every float32 rounding error, so
   that success proves lambda_min(G) > T (analysis below). It runs at about twice the float64 speed
   and reads half the memory; what it cannot prove goes on to stage 1.
0b. Dependence from the leading rows (Kruskal tests). A dependent subset's factorisation fails at the
   first row that depends on the rows before it. Where that row is known to lie early (from the
   failing pivot of the subset's stage 0 factorisation, or, for chunks without stage 0, from where the
   shortcut below settled the subsets of an earlier chunk), the float64 block of the leading rows
   alone is gathered and factorised, and the stage 1b shortcut runs on it with the whole subset's
   bounds (:meth:`_Pool.dependent_lead`): it proves exactly what stage 1b would prove, reading about
   (m / k)^2 of the block and factorising (m / k)^3 of it for m leading rows.
1. Gram + shifted Cholesky in float64. An upper bound ``lam_hi >= lambda_max`` (min of trace,
   Gershgorin row sum and, for subsets, sigma_1^2 of the pool) gives ``tol_hi >= tol``. If the Cholesky
   factorisation of ``G - (tol_hi^2 + 2 delta) I`` succeeds, then lambda_min > tol^2: the matrix is full
   rank. ``delta`` bounds the float64 error of forming and factoring G. The margin of a certified matrix
   is a proven lower bound from the same factor L: lambda_min(G - s I) >= 1 / |L^-1|_F^2 (one batched
   triangular inverse), or the margin floor (below) when the shift was raised to it.
1b. Dependence proof (Kruskal tests, where the exact rank of a dependent subset only feeds a histogram):
   a Rayleigh quotient gives ``lam_lo <= lambda_max`` and hence ``tol_lo <= tol``; if the Cholesky
   factorisation of ``G - (tol_lo^2 - gamma) I`` fails, then lambda_min(G) < tol_lo^2 <= tol^2.
   ``gamma`` is Demmel's bound on how far from singular a matrix can be and still break Cholesky in
   floating point (k (k + 1) u max_i g_ii), plus the error of forming G. Such subsets get rank -1
   (unknown below k) and margin NaN, except the first ``exact_dependent`` of them (in subset order),
   whose exact ranks come from stages 2 and 3.
   Shortcut: when a stage 1 factorisation of the same G has just failed at pivot j, the vector it
   exposes (the null vector of the first j + 1 rows, when they are dependent) often shows in O(k^2)
   that the stage 1b factorisation would fail too (:func:`_quick_dependent`); such subsets get exactly
   the outcome stage 1b would give them, without its power iteration and factorisation.
1c. Tight lambda_max. A matrix neither certified nor proven dependent has its ratio in the band that
   the gap between lam_lo and lam_hi leaves around the tolerance (e.g. tokens with a dominant
   direction whose Gershgorin bound is loose). A dozen power steps give theta <= lambda_max, and a
   successful Cholesky factorisation of theta (1 + 1e-3) I - G proves lambda_max below it
   (:func:`_tight_lambda_max`); stages 1 and 1b run again with these bounds. About three
   factorisations, against an ``eigvalsh`` that costs several times more.
2. Eigenvalues of G (``eigvalsh``) for the rest: exact ranks and margins, except where an eigenvalue
   lies within the float64 error band around tol^2.
3. float64 SVD of X_S itself for those few (and for data whose tolerance is below the Gram's resolution,
   e.g. float64-produced vectors that are nearly dependent).

Stages 0 and 1 decide almost every subset of well-conditioned data; 1b and 2 handle dependent subsets
(e.g. identical CLS tokens) at Cholesky or eigvalsh speed; stage 3 keeps the verdicts exact. Which
subsets get rank -1 (and which an exact rank) depends only on the stage 1b test of each subset (with
the same bound lam_hi, bit for bit, as always), so ranks, verdicts, witnesses and rank histograms do
not depend on the chunking, on stage 0, on the shortcut or on the number of threads.

Margin floor. A Kruskal test reports only the smallest margin over its subsets, so a margin bound for
every certified subset is wasted work (the triangular inverse costs more than the factorisation). The
first ``_PILOT`` subsets get margin bounds as above; from then on the smallest margin m found so far
(over subsets with a known rank) is a floor: stages 0 and 1 shift by ``T = tol_hi^2 10^(2 m)`` instead
of tol_hi^2, and a success proves that the subset's margin is at least m, which it is credited with.
Subsets that fail at the floor go on to stage 1b (most of them are dependent), then to stage 1 at the
base shift with a margin bound of their own (without dependence proofs: straight to stage 2, exact),
and may lower the floor. Every reported margin stays a proven lower bound (or exact), and the minimum
over a test is the minimum of bounds computed exactly as in stage 1, or of exact margins, so it is at
least the minimum the plain float64 path reports. To keep the results independent of thread timing,
chunk j uses the floor of the chunks up to j - ``_LAG``.

Error analysis of stage 0. Let u = 2^-24 (float32 unit roundoff), eps = 2^-52, t = trace(G64) of the
subset's block of the float64 pool Gram G64, and G the exact Gram of the float64 rows.
(a) Forming G64 (standard dot products of length d): |G64 - G| <= gamma_d |X||X|^T elementwise, so
    |G64 - G|_2 <= gamma_d trace(G) <= 2 d eps t.
(b) The block is scaled by an exact power of two c (largest pool diagonal ~ 1, so no float32 overflow)
    and rounded to float32, and the float32 shift s32 = fl(c s) is subtracted from its diagonal in
    float32: B = c (G64 - s I) + E1 with |E1_ij| <= u c |g_ij| off the diagonal and
    |E1_ii| <= 2u (1 + u) c (g_ii + s). Since |g_ij| <= sqrt(g_ii g_jj) (up to a factor 1 + O(d eps)),
    |E1|_2 <= 3u (1 + u) c (t + s).
(c) If float32 Cholesky runs to completion on B, the computed factor satisfies L L^T = B + E2 with
    |E2| <= gamma_{k+1} |L||L^T| (Higham, Accuracy and Stability, Thm 10.3; any order of the inner
    products, blocked or not). With |L||L^T|_ij <= |l_i||l_j| and |l_i|^2 <= b_ii / (1 - gamma_{k+1}),
    |E2|_2 <= gamma_{k+1} / (1 - gamma_{k+1}) trace(B) <= gamma_{k+1} / (1 - gamma_{k+1}) (1 + 3u) c t.
(d) Underflow (or flush-to-zero) adds at most 2^-126 per operation: |E|_2 <= (k + 1)^2 2^-124 / c.
L L^T is positive definite, so lambda_min(G) > s - |E1|/c - |E2|/c - 2 d eps t - (d) =: s - err(s).
The shift solves s - err(s) = T, with every float32 term doubled (``_F32_GUARD``), so success proves
lambda_min(G) > T. The tolerance side uses its own bound lam_hi32 >= lambda_max(G): the trace, the
Gershgorin row sum of the float32 block inflated by 1 + 2 (k + 2) u (rounding of entries and sums) and
the pool's sigma_1^2, each raised by the float64 error of (a). Dependence (stage 1b) is never
concluded in float32: the rounding of float32 is far above (rtol sigma_max)^2 at float32 tolerance.

Speed. On the CPU the blocks are gathered from the pool Gram with NumPy ``take`` (no index tensor per
element pair), chunks hold about 16 MB of float64 blocks (enough subsets that the fixed cost of a
chunk's few dozen batched calls is small beside its factorisations), and with more than one torch thread the chunks run on
up to ``_MAX_WORKERS`` Python threads that share the torch threads (one each on two cores: LAPACK
calls on small matrices use a second thread poorly, and a loaded machine stalls them). While they run,
``torch.set_num_threads`` is lowered; it is restored afterwards, also on errors.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from probes.rank import margins_from_singular_values

_F64_EPS = torch.finfo(torch.float64).eps
_GUARD = 8.0  # safety factor on the float64 error bound of the Gram route
_F32_U = 2.0**-24  # float32 unit roundoff
_F32_GUARD = 2.0  # safety factor on the (worst-case) float32 error bound of stage 0
_F32_MAX_K = 4096  # above this gamma_{k+1} in float32 leaves no room: stage 0 is skipped

_PILOT = 16  # subsets decided with their own margin bounds before a floor exists ...
_PILOT_FLOP = 2e9  # ... fewer (down to 4) when their k^3 factorisations would cost more than this
_LAG = 4  # chunk j is planned from chunks <= j - _LAG (same results with any number of threads)
_PROBE_SUBSETS = 1024  # after float32 stopped paying, try it again about every this many subsets
_CACHE_BYTES = 16 * 2**20  # one chunk's float64 blocks (4 MB ran 5-20% slower at k = 197: per-chunk overhead)
_MAX_CHUNK = 4096
_MAX_WORKERS = 4
_CEIL_1B_K = 384  # from this k on, stage 1b proper also gives its matrices ceilings (see decide)
_LEAD_PAD = 16  # stage 0b: rows gathered beyond the float32 factorisation's failing pivot ...
_LEAD_PAD64 = 4  # ... or beyond where the shortcut found earlier chunks' float64 factorisations failing ...
_LEAD_SHARE = 0.75  # ... while that stays within this share of k (beyond, the full block is gathered)
_MIN_PARALLEL_FLOP = 2e8  # below this much Cholesky work the chunks run in the calling thread

STAGE_KEYS = ("cholesky", "cholesky_dependent", "eigvalsh", "svd", "cholesky32")


@dataclass
class Decisions:
    """Per-matrix outcome: rank (S,), margin (S,) in decades (a lower bound where certified), and how
    many matrices each stage decided (``cholesky32``: stage 0, float32). A matrix proven rank-deficient
    without an exact rank (stage 1b) has rank -1 and margin NaN. ``bound`` (S,) bool: True where the
    margin is a certified lower bound (stages 0 and 1), False where it is exact (stages 2 and 3) or NaN."""

    rank: torch.Tensor
    margin: torch.Tensor
    stages: dict[str, int]
    shortcut: int = 0  # of the ``cholesky_dependent`` ones, how many the stage 1b shortcut settled
    bound: torch.Tensor | None = None
    ceiling: torch.Tensor | None = None  # (S,) proven ceiling >= sigma_k / sigma_1 (inf: none known);
    # from the stage 1b shortcut and from the exact spectra (stages 2 and 3), only where asked for
    fail_at: torch.Tensor | None = None  # (S,) int64: for matrices the shortcut settled, the 1-based pivot
    # at which the factorisation it used failed (0 elsewhere); plans stage 0b of later chunks


def _new_stages() -> dict[str, int]:
    return dict.fromkeys(STAGE_KEYS, 0)


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


def _gram_error(gram: torch.Tensor | None, lam_hi: torch.Tensor, width: int, *, k: int | None = None,
                trace: torch.Tensor | None = None) -> torch.Tensor:
    """Bound on the float64 error of forming and factoring each Gram matrix: (c,).

    Forming G from rows of width d moves it by at most gamma_d trace(G) in norm (|G64 - G| <=
    gamma_d |X||X|^T elementwise), and a Cholesky factorisation or an eigendecomposition of G - s I is
    backward stable within gamma_{k+1} trace (Higham, Thm 10.3: |E| <= gamma_{k+1} |L||L^T|); both
    are at most (k + d) eps trace / 2. The bound is ``_GUARD`` (k + d) eps max(lam_hi, trace / 8),
    at least twice that, and the guarded lam_hi term alone wherever the spectrum is not too flat
    (trace <= 8 lam_hi). ``k`` and ``trace`` of the whole matrices when ``gram`` is not given whole."""
    k = gram.shape[-1] if k is None else k
    if trace is None:
        trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    return _GUARD * (k + width) * _F64_EPS * torch.maximum(lam_hi, trace / 8)


def _lam_hi(gram: torch.Tensor, lam_cap: float | None, *, quick: bool = False) -> torch.Tensor:
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
    return _capped(torch.minimum(trace, gersh), lam_cap, k)


def _capped(lam_hi: torch.Tensor, lam_cap: float | None, k: int) -> torch.Tensor:
    """lam_hi capped by the pool's sigma_1^2 (``lam_cap``, None: no cap), raised by its rounding."""
    return lam_hi if lam_cap is None else lam_hi.clamp(max=lam_cap * (1 + 64 * k * _F64_EPS))


def decide(
    gram: torch.Tensor,
    rows,
    rtol: float,
    width: int,
    *,
    lam_cap: float | None = None,
    exact_dependent: int | None = None,
    dependent_first: bool = False,
    floor: float | None = None,
    reach: float | None = None,
    ceilings: bool = False,
    exact_first: torch.Tensor | None = None,
    lam_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Decisions:
    """Ranks and margins of c matrices given their Gram matrices (stages 1 to 3).

    Args:
        gram: (c, k, k) float64 Gram matrices X_S X_S^T (the diagonal is used as scratch and restored).
        rows: callable taking a LongTensor of positions in 0..c-1 and returning the matching (c', k, d)
            float64 matrices X_S (only called for the few that need the exact SVD).
        rtol: relative tolerance (singular values above ``rtol * sigma_max`` count).
        width: d, the row width (enters the float64 error bound of the Gram route).
        lam_cap: a known upper bound on every lambda_max, e.g. sigma_1^2 of the pool the rows come
            from (interlacing); tightens stage 1.
        exact_dependent: None to compute the exact rank of every matrix; an integer to prove rank
            deficiency by stage 1b and compute exact ranks for the first this many dependent matrices
            (in order; besides those the exact stages decide anyway).
        dependent_first: run stage 1b before stage 1 (pays off when most matrices are dependent).
        floor: a margin (decades) to certify at: matrices whose factorisation succeeds with the shift
            raised to it are credited with this margin, without a margin bound of their own (see the
            module docstring). None: a margin bound for every certified matrix.
        reach: with a floor, certify at this larger margin first (matrices that pass are credited with
            it; the others go on at the floor). Ranks do not depend on it; it spares later proofs that a
            matrix stays full rank at a larger tolerance (:mod:`probes.robust`).
        ceilings: also give the matrices that the stage 1b shortcut proves dependent a proven ceiling
            on sigma_k / sigma_1 (``Decisions.ceiling``, inf elsewhere): a refinement step and two power
            steps on the vector the shortcut already has; matrices decided from exact spectra (stages 2
            and 3) get one from those spectra. (Stage 1b proper gives none: where it is needed, the
            dependence is rarely far below the tolerance.)
        exact_first: (c,) bool, or None: matrices that get an exact rank if they are dependent (the
            first of the rank histogram): the certificates are tried as usual, but where they fail the
            matrix goes straight to the exact stages, without a dependence proof first.
        lam_bounds: (lo, hi), each (c,): proven bounds lo <= lambda_max <= hi of each matrix (hi inf
            where unknown), e.g. from :func:`_tight_lambda_max`; they replace the usual bounds where
            tighter, and stage 1c is skipped.
    """
    c, k, _ = gram.shape
    device = gram.device
    rank = torch.full((c,), k, dtype=torch.int64, device=device)
    margin = torch.full((c,), math.inf, dtype=torch.float64, device=device)
    stages = _new_stages()
    bound = torch.zeros(c, dtype=torch.bool, device=device)
    ceiling = torch.full((c,), math.inf, dtype=torch.float64, device=device) if ceilings else None
    fail_at = torch.zeros(c, dtype=torch.int64, device=device)
    if c == 0:
        return Decisions(rank, margin, stages, bound=bound, ceiling=ceiling, fail_at=fail_at)

    prove = exact_dependent is not None and k > 1
    floor_first = _usable_floor(floor) and not (prove and dependent_first)
    lam_lo = None
    if lam_bounds is not None:
        floor_first = False
        lam_lo, known = lam_bounds
        lam_hi = torch.minimum(_lam_hi(gram, lam_cap), known)
    else:
        lam_hi = _lam_hi(gram, lam_cap, quick=floor_first)  # exact bound recomputed after the floor stage
    todo = torch.arange(c, device=device)

    def part(a: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # no copy while nothing is decided
        return a if pos.numel() == c else a[pos]

    proven: list[torch.Tensor] = []  # positions proven dependent (stage 1b or its shortcut)
    shortcut = 0
    early = exact_first if prove and exact_first is not None and bool(exact_first.any()) else None

    def dependent(pos: torch.Tensor, ceil: torch.Tensor | None) -> None:
        stages["cholesky_dependent"] += int(pos.numel())
        rank[pos] = -1
        margin[pos] = math.nan
        if ceiling is not None and ceil is not None:
            ceiling[pos] = ceil
        proven.append(pos)

    held = todo[:0]  # matrices of ``exact_first`` kept for the exact stages

    def hold(todo: torch.Tensor) -> torch.Tensor:
        nonlocal held
        if early is None or not todo.numel():
            return todo
        mine = early[todo]
        if not bool(mine.any()):
            return todo
        held = torch.cat([held, todo[mine]])
        return todo[~mine]

    def stage_dependent(todo: torch.Tensor) -> torch.Tensor:
        # Stage 1b: prove rank deficiency by a failing Cholesky factorisation.
        # (a ceiling costs a few matrix-vector products: only where k is large enough for that to be
        # small beside the factorisation)
        want = ceiling is not None and k >= _CEIL_1B_K
        dep, ceil = _prove_dependent(part(gram, todo), part(lam_hi, todo), rtol, width, ceilings=want,
                                     lam_lo=None if lam_lo is None else part(lam_lo, todo))
        dependent(todo[dep], ceil[dep] if want else None)
        return todo[~dep]

    def certify(stage, todo: torch.Tensor, *args, quick: bool = True) -> torch.Tensor:
        # a stage 1 variant; where its factorisation failed, the shortcut of stage 1b may settle it
        nonlocal floor_first
        g = part(gram, todo)
        ok, chol, info = stage(g, todo, part(lam_hi, todo), rtol, width, rank, margin, stages, *args)
        bound[todo[ok]] = True
        if floor_first and not bool(ok.all()):  # from here on, the exact bound of the other stages
            floor_first = False
            rest = slice(None) if not bool(ok.any()) else ~ok
            lam_hi[todo[rest]] = _lam_hi(g[rest], lam_cap)
        if prove and quick and not bool(ok.all()):
            nonlocal shortcut
            candidates = ~ok if early is None else ~ok & ~early[todo]  # (early ones: exact ranks instead)
            settled, ceil = _quick_dependent(g, chol, info, part(lam_hi, todo), rtol, width, candidates, ceilings)
            dependent(todo[settled], ceil[settled])
            fail_at[todo[settled]] = info[settled].to(torch.int64)
            shortcut += int(settled.sum())
            ok = ok | settled
        return todo[~ok]

    def stage_tight(todo: torch.Tensor) -> torch.Tensor:
        # Stage 1c: what neither the certificate nor the proof decided lies in the band that the gap
        # between lam_lo and lam_hi leaves; bracket lambda_max to about 0.1% and try both again.
        lo, hi = _tight_lambda_max(part(gram, todo))
        ok = hi < part(lam_hi, todo)
        if not bool(ok.any()):
            return todo
        lam_hi[todo[ok]] = hi[ok]
        cand, lo = todo[ok], lo[ok]
        rest = certify(_stage_certify, cand)
        if prove and rest.numel():
            dep, _ = _prove_dependent(gram[rest], lam_hi[rest], rtol, width, lam_lo=lo[torch.isin(cand, rest)])
            dependent(rest[dep], None)
            rest = rest[~dep]
        return torch.cat([todo[~ok], rest]).sort().values

    if prove and dependent_first:
        todo = stage_dependent(hold(todo))
    if _usable_floor(floor) and todo.numel():
        # certify at the floor first; what fails there is mostly dependent, so stage 1b comes next
        if reach is not None and reach > floor:  # (what fails here is tried again at the floor)
            todo = certify(_stage_floor, todo, reach, quick=False)
        if todo.numel():
            todo = hold(certify(_stage_floor, todo, floor))
        if prove and not dependent_first and todo.numel():
            todo = stage_dependent(todo)
        if prove and todo.numel() and floor > 0:  # (without proofs, stage 2 settles the rest exactly
            todo = certify(_stage_certify, todo)  # anyway; at floor 0 it would repeat the floor stage)
    else:
        if todo.numel():
            todo = hold(certify(_stage_certify, todo))
        if prove and not dependent_first and todo.numel():
            todo = stage_dependent(todo)
    if todo.numel() and k > 1 and lam_bounds is None:
        todo = stage_tight(todo)
    if held.numel():
        todo = torch.cat([todo, held]).sort().values
    if todo.numel():
        _stage_exact(part(gram, todo), todo, rows, part(lam_hi, todo), rtol, width, rank, margin, stages, ceiling)
    if prove and exact_dependent and proven:
        # exact ranks for the histogram, for the first ``exact_dependent`` dependent matrices in order
        # (those of ``exact_first`` have them already): eigenvalues (SVD inside the error band)
        order = (rank != k).nonzero().flatten()[:exact_dependent]
        exact = order[rank[order] == -1]
        _stage_exact(gram[exact], exact, rows, lam_hi[exact], rtol, width, rank, margin, stages, ceiling)
    return Decisions(rank, margin, stages, shortcut, bound, ceiling, fail_at)


def _usable_floor(floor: float | None) -> bool:
    return floor is not None and math.isfinite(floor) and floor >= 0


def _floor_target(tol_hi2: torch.Tensor, floor: float) -> torch.Tensor:
    """T = tol_hi^2 10^(2 floor): lambda_min(G) > T proves a margin >= floor (inf where it overflows)."""
    return tol_hi2 * 10.0 ** min(2 * floor, 300.0)


def _stage_floor(gram, todo, lam_hi, rtol, width, rank, margin, stages, floor) -> torch.Tensor:
    """Stage 1 at the margin floor: Cholesky of G - (T + 2 delta) I with T = tol_hi^2 10^(2 floor)
    succeeds  =>  lambda_min(G) > T: full rank, margin >= floor (credited with the floor). Returns which
    positions it certified, and the factors and ``info`` of the factorisations."""
    k = gram.shape[-1]
    target = _floor_target(rtol**2 * lam_hi, floor)
    chol, info = _shifted_cholesky(gram, target + 2 * _gram_error(gram, lam_hi, width))
    ok = (info == 0) & (target > 0) & (target < lam_hi)
    rank[todo[ok]] = k
    margin[todo[ok]] = floor
    stages["cholesky"] += int(ok.sum())
    return ok, chol, info


def _stage_certify(gram, todo, lam_hi, rtol, width, rank, margin, stages) -> torch.Tensor:
    """Stage 1: Cholesky of G - s I succeeds  =>  lambda_min(G) > s >= tol^2 (full rank, margin
    bound written into ``margin``). Returns which positions it certified, and the factors and ``info``
    of the factorisations."""
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
    return certified, chol, info


def _stage_exact(gram, todo, rows, lam_hi, rtol, width, rank, margin, stages, ceiling=None) -> None:
    """Stage 2 (eigenvalues of G) and stage 3 (float64 SVD of X_S where stage 2 is ambiguous).

    ``ceiling``: if given, receives at ``todo`` a proven upper bound on sigma_k / sigma_1 from the same
    spectra: sqrt((lambda_k + 2 delta) / (lambda_1 - 2 delta)) with delta the error bound of the Gram
    route (stage 2), (s_k + e) / (s_1 - e) with e = (k + d) eps s_1 for the SVD (stage 3)."""
    k = gram.shape[-1]
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
    if ceiling is not None:
        bottom = lam_max - 2 * err
        up = torch.sqrt((lam[:, -1] + 2 * err) / bottom.clamp(min=torch.finfo(gram.dtype).tiny)) * (1 + 1e-12)
        ceiling[todo] = torch.where((bottom > 0) & torch.isfinite(up), up.clamp(max=1.0), 1.0)
    hard = todo[ambiguous]
    if hard.numel():
        sv3 = torch.linalg.svdvals(rows(hard))  # (h, k)
        rank[hard], margin[hard] = margins_from_singular_values(sv3, rtol * sv3[:, 0])
        stages["svd"] += int(hard.numel())
        if ceiling is not None:
            e = (k + width) * _F64_EPS * sv3[:, 0]
            bottom = sv3[:, 0] - e
            up = (sv3[:, k - 1] + e) / bottom.clamp(min=torch.finfo(gram.dtype).tiny) * (1 + 1e-12)
            ceiling[hard] = torch.where((bottom > 0) & torch.isfinite(up), up.clamp(max=1.0), 1.0)


def _pivot_vectors(gram: torch.Tensor, chol: torch.Tensor, pivot: torch.Tensor,
                   candidates: torch.Tensor) -> torch.Tensor:
    """(t, k, 1): v = [-z; 1; 0] with z ~ G_11^-1 g_j at each candidate's failing pivot j, from the
    factor of G_11 - s I (zero elsewhere)."""
    t, k, _ = gram.shape
    v = torch.zeros(t, k, 1, dtype=gram.dtype, device=gram.device)
    for j in pivot[candidates].unique().tolist():
        group = candidates & (pivot == j)
        pos = slice(None) if bool(group.all()) else group.nonzero().flatten()  # views when all alike
        v[pos, j] = 1.0
        if j > 0:
            l11 = chol[pos, :j, :j]  # only its lower triangle is read
            y = torch.linalg.solve_triangular(l11, gram[pos, :j, j : j + 1], upper=False)
            v[pos, :j] = -torch.linalg.solve_triangular(l11.transpose(1, 2), y, upper=True)
    return v


def _refine(gram: torch.Tensor, chol: torch.Tensor, pivot: torch.Tensor, v: torch.Tensor,
            rest: torch.Tensor | None) -> None:
    """One step of iterative refinement of z = G_11^-1 g_j (in place, at positions ``rest``, None: all):
    the error of z shrinks by about s / lambda_min(G_11) per step."""
    piv = pivot if rest is None else pivot[rest]
    groups = piv.unique().tolist()
    for j in groups:
        if j == 0:
            continue
        if rest is None:
            pos = slice(None) if len(groups) == 1 else (pivot == j).nonzero().flatten()
        else:
            pos = rest[piv == j]
        l11, z = chol[pos, :j, :j], -v[pos, :j]
        resid = gram[pos, :j, j : j + 1] - gram[pos, :j, :j] @ z
        y = torch.linalg.solve_triangular(l11, resid, upper=False)
        v[pos, :j] = -(z + torch.linalg.solve_triangular(l11.transpose(1, 2), y, upper=True))


def _rayleigh_up(gram: torch.Tensor, v: torch.Tensor, trace: torch.Tensor, width: int, pos,
                 size: int | None = None) -> torch.Tensor:
    """Rigorous upper bound on v^T G v / v^T v at ``pos``, G as stored (both triangles read). ``size``:
    v is zero beyond its first ``size`` entries (only that leading block of G is read)."""
    k, u = gram.shape[-1], _F64_EPS / 2
    size = k if size is None else size
    vp = v[pos, :size]
    num = (vp * (gram[pos, :size, :size] @ vp)).sum((1, 2))
    den = (vp * vp).sum((1, 2))
    rounding = (2 * (k + 1) + 2 * width) * u * 1.01 * den * trace[pos]  # products, sums, G vs G^T
    r_up = (num + rounding) / (den * (1 - 2 * k * u))
    return torch.where(torch.isfinite(r_up), r_up, math.inf)


def _power_lower(gram: torch.Tensor, steps: int = 4, *, vector: bool = False):
    """(t,) lower bounds on lambda_max(G as stored): the largest diagonal entry and the Rayleigh quotient
    after ``steps`` power steps from the all-ones vector (unit v: <= lambda_max up to rounding, which
    the factor 1 - 4 k eps covers). ``vector``: also return the unit vectors v and G v, each (t, k, 1)."""
    k = gram.shape[-1]
    v = torch.ones(gram.shape[0], k, 1, dtype=gram.dtype, device=gram.device)
    for _ in range(max(1, steps)):  # (at least one step: v unit)
        v = gram @ v
        v = v / v.norm(dim=1, keepdim=True).clamp(min=torch.finfo(gram.dtype).tiny)
    gv = gram @ v
    rayleigh = (v.transpose(1, 2) @ gv)[:, 0, 0]
    lo = torch.maximum(gram.diagonal(dim1=-2, dim2=-1).amax(-1), rayleigh) * (1 - 4 * k * _F64_EPS)
    return (lo, v, gv) if vector else lo


def _ceilings(gram: torch.Tensor, chol: torch.Tensor, pivot: torch.Tensor, v: torch.Tensor, r_up: torch.Tensor,
              pos: torch.Tensor, trace: torch.Tensor, width: int, lam_lo: torch.Tensor | None = None) -> torch.Tensor:
    """Proven ceilings on sigma_k / sigma_1 of the rows at ``pos``: sqrt(R / lam_lo) with R the smaller
    Rayleigh bound of the pivot vector v before and after one more refinement step (R >= lambda_min),
    lam_lo <= lambda_max (:func:`_power_lower`, two steps, unless given), and the error of forming G
    (|G - X X^T|_2 <= gamma_d trace) on both sides. ``r_up``: the bound of v as it is, at ``pos``."""
    k = gram.shape[-1]
    gram, chol, pivot, v, trace = gram[pos], chol[pos], pivot[pos], v[pos], trace[pos]  # one copy each
    _refine(gram, chol, pivot, v, None)
    best = torch.minimum(r_up, _rayleigh_up(gram, v, trace, width, slice(None)))
    if lam_lo is None:
        lam_lo = _power_lower(gram, steps=2)
    err = 2.02 * width * _F64_EPS * trace
    top = (best + err).clamp(min=0)
    bottom = lam_lo * (1 - 4 * k * _F64_EPS) - err
    out = torch.sqrt(top / bottom.clamp(min=torch.finfo(torch.float64).tiny)) * (1 + 1e-12)
    return torch.where((bottom > 0) & torch.isfinite(out), out.clamp(max=1.0), 1.0)


def _quick_dependent(gram: torch.Tensor, chol: torch.Tensor, info: torch.Tensor, lam_hi: torch.Tensor,
                     rtol: float, width: int, candidates: torch.Tensor, ceilings: bool = False,
                     full: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(t,) bool: matrices whose stage 1b factorisation is certain to fail, shown from a failed stage 1
    factorisation of the same G (shift s, failure at pivot j), without running stage 1b; and (t,) a
    proven ceiling on sigma_k / sigma_1 of those matrices (1 elsewhere; only with ``ceilings``).

    The factored leading block gives the vector v = [-G_11^-1 g_j; 1; 0] (for a subset whose first j
    rows are dependent, their null vector), computed with the factor of G_11 - s I and two steps of
    refinement. Its Rayleigh
    quotient R = v^T G v / v^T v >= lambda_min(G), evaluated in float64 with a bound on the rounding
    (and on the asymmetry of G's two triangles), is compared with a lower bound s_lo of the stage 1b
    shift (the same formula, with lam_lo replaced by the largest of the diagonal and the Rayleigh
    quotient of the all-ones vector, both below the power-iteration value). Had the stage 1b
    factorisation of G - s_1b I succeeded, Higham's backward error bound (Thm 10.3) would give
    lambda_min(G) >= s_1b - 4 ((k + 2) u trace(G) + u (max g_ii + lam_hi)); so R below s_lo minus that
    much means it fails: the matrix is dependent (R < tol^2) and is exactly one stage 1b would prove.
    The ceiling: :func:`_ceilings`.

    ``full``: (trace, largest diagonal entry, k) of the whole matrices when ``gram`` (and ``chol``,
    ``info``) hold only their leading m x m blocks (:meth:`_Pool.dependent_lead`); ``lam_hi`` must
    then be at least the bound stage 1b computes from the whole matrix. The bounds use the whole
    matrix's values; the tested vector is zero beyond row m, and the ceilings use the largest diagonal
    entry for lambda_max (no power steps on the whole matrix).
    """
    t, m, _ = gram.shape
    u = _F64_EPS / 2
    pivot = info.to(torch.int64) - 1  # the failing pivot, 0-based = columns factored before it
    candidates = candidates & (info > 0) & (pivot < m)
    ceiling = torch.ones(t, dtype=gram.dtype, device=gram.device)
    if not bool(candidates.any()):
        return candidates, ceiling
    if full is None:
        diag = gram.diagonal(dim1=-2, dim2=-1)
        trace, dmax, k = diag.sum(-1), diag.amax(-1), m
    else:
        trace, dmax, k = full
    gamma = 2 * k * (k + 1) * _F64_EPS * dmax + 2 * _gram_error(None, lam_hi, width, k=k, trace=trace)  # as stage 1b
    backward = 4 * ((k + 2) * u * trace + u * (dmax + lam_hi))

    def threshold(lam_lo: torch.Tensor) -> torch.Tensor:  # (lower bound of the 1b shift) - backward
        s_lo = (rtol**2 * lam_lo * (1 - 4 * k * _F64_EPS) - gamma) * (1 - 1e-12)
        return torch.where(s_lo > 0, s_lo - backward, -math.inf)

    bound = threshold(dmax)  # lam_lo >= the largest diagonal entry
    v = _pivot_vectors(gram, chol, pivot, candidates)
    size = int(pivot[candidates].max()) + 1  # v is zero beyond
    r_up = _rayleigh_up(gram, v, trace, width, slice(None), size)
    for _ in range(2):  # refinement where needed
        rest = (candidates & (pivot > 0) & ~(r_up < bound)).nonzero().flatten()
        if not rest.numel():
            break
        _refine(gram, chol, pivot, v, rest)
        r_up[rest] = _rayleigh_up(gram, v, trace, width, rest, size)
    ok = candidates & (r_up < bound)
    if full is None and bool((candidates & ~ok).any()):  # lam_lo >= the Rayleigh quotient of 1 too
        ones = (gram.sum((-2, -1)) - 1.01 * k**3 * u * trace) / k * (1 - 1e-10)  # (rounded down)
        ok = candidates & (r_up < threshold(torch.maximum(dmax, ones)))
    if ceilings and bool(ok.any()):  # (from a leading block: lambda_max >= the largest diagonal entry)
        pos = ok.nonzero().flatten()
        ceiling[pos] = _ceilings(gram, chol, pivot, v, r_up[pos], pos, trace, width,
                                 None if full is None else dmax[pos])
    return ok, ceiling


def _tight_lambda_max(gram: torch.Tensor, steps: int = 12, gap: float = 1e-3,
                      residual: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) with lo <= lambda_max(G as stored) <= hi, hi = inf where not proven.

    lo: :func:`_power_lower` after ``steps`` power steps (theta). hi: mu = theta (1 + gap), or with
    ``residual`` mu = max(theta (1 + gap), theta + 2 |G v - theta v|) for the unit power vector v (where
    the power steps have not converged, theta (1 + gap) is often below lambda_max and proves nothing;
    the residual says by about how much), proven when
    the Cholesky factorisation of mu I - G succeeds: then L L^T = mu I - G + E with |E|_2 <=
    gamma_{k+1} / (1 - gamma_{k+1}) trace(mu I - G) <= 1.01 (k + 1) u k mu (Higham, Thm 10.3), plus
    u mu for rounding the diagonal, so lambda_max(G) <= mu (1 + 1.01 (k + 1) u k + 2 u)."""
    t, k, _ = gram.shape
    u = _F64_EPS / 2
    if residual:
        lo, v, gv = _power_lower(gram, steps, vector=True)
    else:
        lo = _power_lower(gram, steps)
    theta = lo / (1 - 4 * k * _F64_EPS)
    mu = theta * (1 + gap)
    if residual:
        rho = torch.linalg.vector_norm(gv - theta[:, None, None] * v, dim=(1, 2))
        mu = torch.maximum(mu, theta + 2 * rho)
    a = gram.neg()
    a.diagonal(dim1=-2, dim2=-1).add_(mu[:, None])
    _, info = torch.linalg.cholesky_ex(a)
    hi = mu * (1 + 1.01 * (k + 1) * u * k + 2 * u) * (1 + 1e-12)
    return lo, torch.where((info == 0) & (mu > 0) & torch.isfinite(mu), hi, math.inf)


def _prove_dependent(gram: torch.Tensor, lam_hi: torch.Tensor, rtol: float, width: int, *,
                     ceilings: bool = False,
                     lam_lo: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(t,) bool: True where lambda_min(G) < (rtol sigma_max)^2 is proven by a failing Cholesky; and,
    with ``ceilings``, (t,) proven ceilings on sigma_k / sigma_1 of those matrices (1 elsewhere) from
    the vector the failed factorisation exposes (:func:`_ceilings`), else None.

    lam_lo: the largest of the diagonal and a Rayleigh quotient after a few power steps (both
    <= lambda_max, so tol_lo <= tol), unless given (stage 1c gives a tighter one). Cholesky of A = G - s I fails in floating point only when
    lambda_min(A) <= k (k + 1) u max_i a_ii (Demmel); the shift s leaves that much room, plus the error
    of forming G, below tol_lo^2.
    """
    t, k, _ = gram.shape
    diag = gram.diagonal(dim1=-2, dim2=-1)  # (t, k)
    if lam_lo is None:
        lam_lo = _power_lower(gram)
    gamma = 2 * k * (k + 1) * _F64_EPS * diag.amax(-1) + 2 * _gram_error(gram, lam_hi, width)
    shift = rtol**2 * lam_lo - gamma  # (t,)
    chol, info = _shifted_cholesky(gram, shift.clamp(min=0))
    dep = (info != 0) & (shift > 0)
    if not ceilings:
        return dep, None
    ceiling = torch.ones(t, dtype=gram.dtype, device=gram.device)
    pivot = info.to(torch.int64) - 1
    cand = dep & (info > 0) & (pivot < k)
    if bool(cand.any()):
        trace = diag.sum(-1)
        pos = cand.nonzero().flatten()
        vec = _pivot_vectors(gram, chol, pivot, cand)
        r_up = _rayleigh_up(gram, vec, trace, width, pos)
        ceiling[pos] = _ceilings(gram, chol, pivot, vec, r_up, pos, trace, width, lam_lo[pos])
    return dep, ceiling


def chunk_size(k: int, d: int, budget_bytes: int = 256 * 2**20) -> int:
    """How many k x k (plus k x d for the fallback) float64 matrices fit in the memory budget."""
    per = 8 * (3 * k * k + k * d)
    return max(1, budget_bytes // per)


# ----------------------------------------------------------------------------- k-subsets of a pool


@dataclass
class _Plan:
    """What chunk j does, fixed by the chunks <= j - _LAG: the margin floor (None: margin bounds for
    every certified subset), whether stage 0 runs, and whether stage 1b goes first."""

    floor: float | None
    use32: bool
    dependent_first: bool
    reach: float | None = None  # certify at this margin first (see :func:`decide`)
    lead: int | None = None  # stage 0b on this many leading rows, without stage 0 (_Pool.dependent_lead)


@dataclass
class _Chunk:
    """A decided chunk: its ranks, margins and stage counts, and what the plan of later chunks needs."""

    rank: torch.Tensor
    margin: torch.Tensor
    stages: dict[str, int]
    min_margin: float  # over subsets with a known rank (inf if none)
    bound: torch.Tensor  # (c,) bool: the margin is a certified lower bound
    tried32: bool
    rate32: float  # share certified by stage 0 (when tried)
    dependent_share: float  # share dependent (proven by stage 1b, or of exact rank < k)
    shortcut: int  # how many of those the stage 1b shortcut settled
    ceiling: torch.Tensor | None = None  # (c,) see :class:`Decisions`
    reach_miss: float | None = None  # with a reach: share certified at the floor but not at the reach
    fail_at: torch.Tensor | None = None  # 1-based failing pivots of the subsets the shortcut settled


class _Pool:
    """The pool side of :func:`subset_decisions`: gathers each subset's Gram block and runs stage 0.

    On the CPU with a pool Gram, blocks are copied by ``numpy.take`` with one linear index per chunk
    into per-thread buffers that are reused from chunk to chunk."""

    def __init__(self, vectors64, pool_gram, k, rtol, lam_cap, step):
        self.x = vectors64
        self.gram = pool_gram
        self.k, self.d, self.n = k, vectors64.shape[1], vectors64.shape[0]
        self.rtol, self.lam_cap, self.step = rtol, lam_cap, step
        self.numpy = pool_gram is not None and pool_gram.device.type == "cpu"
        if self.numpy:
            self.g64 = pool_gram.contiguous().numpy()
            self.diag64 = np.ascontiguousarray(np.diagonal(self.g64))
        self.can32 = self.numpy and 2 <= k <= _F32_MAX_K
        self._g32 = None
        self._lock = threading.Lock()
        self._local = threading.local()

    # -------------------------------------------------------------- buffers and gathers (CPU)
    def _buffers(self):
        buf = getattr(self._local, "buf", None)
        if buf is None:
            size = self.step * self.k * self.k  # flat: any (c, m, m) with c <= step, m <= k fits
            buf = self._local.buf = {
                "lin": np.empty(size, dtype=np.int64), "rowoff": np.empty(self.step * self.k, dtype=np.int64),
                "b64": np.empty(size, dtype=np.float64), "b32": np.empty(size, dtype=np.float32),
                "l32": torch.empty((self.step, self.k, self.k), dtype=torch.float32),
                "info": torch.empty(self.step, dtype=torch.int32),
            }
        return buf

    def _take(self, source: np.ndarray, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
        """(c, m, m) blocks source[idx[i]][:, idx[i]] of the (n, n) ``source`` for idx (c, m), into the
        flat buffer ``out``."""
        buf = self._buffers()
        idx = idx.astype(np.int64, copy=False)
        c, m = idx.shape
        rowoff = np.multiply(idx, self.n, out=buf["rowoff"][: c * m].reshape(c, m))
        lin = np.add(rowoff[:, :, None], idx[:, None, :], out=buf["lin"][: c * m * m].reshape(c, m, m))
        # indices are valid; clip is the fastest mode
        return np.take(source.reshape(-1), lin, out=out[: c * m * m].reshape(c, m, m), mode="clip")

    def gram64(self, idx: torch.Tensor) -> torch.Tensor:
        """(c, k, k) float64 Gram blocks of the subsets ``idx`` (c, k) (a reused buffer on the CPU)."""
        if self.gram is None:
            x = self.x[idx]  # (c, k, d)
            return x @ x.transpose(1, 2)
        if not self.numpy:
            return self.gram[idx[:, :, None], idx[:, None, :]]
        return torch.from_numpy(self._take(self.g64, idx.numpy(), self._buffers()["b64"]))

    def _pool32(self) -> tuple[np.ndarray, float]:
        with self._lock:
            if self._g32 is None:
                top = float(self.diag64.max()) if self.diag64.size else 0.0
                e = math.frexp(top)[1] if top > 0 else 0
                scale = math.ldexp(1.0, -e)  # exact power of two: largest diagonal in [1/2, 1)
                g32 = torch.empty(self.gram.shape, dtype=torch.float32)
                torch.mul(self.gram, scale, out=g32)  # exact scaling, one rounding to float32
                self._g32 = (g32.numpy(), scale)
            return self._g32

    # -------------------------------------------------------------- stage 0
    def certify32(self, idx: torch.Tensor, floor: float, *, detail: bool = False):
        """(c,) bool: lambda_min(G) > T = rtol^2 lam_hi32 10^(2 floor), proven in float32 (module
        docstring); a success certifies full rank with margin >= floor. ``detail``: also return the
        factorisations' ``info`` (c,) and (c,) upper bounds on the float64 Gershgorin bound that
        :func:`_lam_hi` computes from the same block (for :meth:`dependent_lead`)."""
        k, d, u = self.k, self.d, _F32_U
        g32, scale = self._pool32()
        buf = self._buffers()
        idx_np = idx.numpy()
        c = idx_np.shape[0]
        block = torch.from_numpy(self._take(g32, idx_np, buf["b32"]))  # (c, k, k) float32
        trace = torch.from_numpy(self.diag64[idx_np].sum(1)) * (1 + 2 * (k + d) * _F64_EPS)  # >= trace(G)
        gersh = block.abs().sum(-1).amax(-1).to(torch.float64) / scale  # float32 row sums, unscaled
        gersh_up = gersh * (1 + 2 * (k + 2) * u)  # >= every row sum of |G64| (rounding of entries and sums)
        lam_hi = _capped(torch.minimum(trace, gersh_up + 2 * d * _F64_EPS * trace), self.lam_cap, k)
        target = _floor_target(self.rtol**2 * lam_hi, floor)
        gam = (k + 1) * u / (1 - (k + 1) * u)
        chol = gam / (1 - gam) * (1 + 3 * u)  # (c): Cholesky backward error per unit trace
        cast = 3 * u * (1 + u)  # (b): rounding the block and the shift, per unit (trace + shift)
        tiny = (k + 1) ** 2 * 2.0**-124 / scale  # (d)
        g = _F32_GUARD
        shift = (target + (g * (chol + cast) + 2 * d * _F64_EPS) * trace + g * tiny) / (1 - g * cast)
        block.diagonal(dim1=-2, dim2=-1).sub_((shift * scale).to(torch.float32)[:, None])
        lbuf = buf["l32"][:c]
        _, info = torch.linalg.cholesky_ex(block, out=(lbuf.transpose(1, 2), buf["info"][:c]))
        ok = (info == 0) & (target > 0) & (target < lam_hi) & torch.isfinite(shift)
        if not detail:
            return ok
        # the float64 row sums of the same entries are at most (1 + 2 k eps) times their exact sums
        return ok, info.clone(), gersh_up * (1 + 2 * k * _F64_EPS)

    def dependent_lead(self, idx: torch.Tensor, size: int, gersh_up: torch.Tensor | None = None,
                       ceilings: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stage 0b: dependence proven from the leading rows only. Returns (c,) bool: the subsets
        ``idx`` (c, k) proven dependent exactly as stage 1b would prove them, (c,) the failing pivot
        (1-based, 0 where the factorisation succeeded), and (c,) proven ceilings on sigma_k / sigma_1
        of those proven (1 elsewhere; with ``ceilings``, else all 1).

        A dependent subset's Cholesky factorisation fails at the first row that depends on the rows
        before it; when that row lies among the first ``size`` rows (known from a float32
        factorisation of the subset, or from the subsets decided before), the float64 Gram block of
        those rows alone is gathered, factorised with a shift below the stage 1b shift, and the stage
        1b shortcut (:func:`_quick_dependent`) runs on it with every bound taken from the whole subset:
        k, its trace and largest diagonal entry (from the pool's diagonal) and an upper bound on the
        lam_hi stage 1b computes (the trace, the pool's cap and, where given, ``gersh_up`` from
        :meth:`certify32`). The vector it tests is zero beyond the block, so its Rayleigh quotient on the
        block equals the one on the whole Gram matrix. What it leaves goes on to the float64 stages."""
        k, d = self.k, self.d
        idx_np = idx.numpy()
        diag = torch.from_numpy(self.diag64[idx_np])  # (c, k): the blocks' diagonals, as gathered
        trace = diag.sum(-1) * (1 + 2 * k * _F64_EPS)  # >= the trace as any summation order computes it
        dmax = diag.amax(-1)
        # >= the lam_hi stage 1b computes (same cap)
        lam_hi = _capped(trace if gersh_up is None else torch.minimum(trace, gersh_up), self.lam_cap, k)
        gamma = 2 * k * (k + 1) * _F64_EPS * dmax + 2 * _gram_error(None, lam_hi, d, k=k, trace=trace)
        shift = self.rtol**2 * dmax * (1 - 4 * k * _F64_EPS) - gamma  # <= the stage 1b shift
        if not bool((shift > 0).any()):  # (a tolerance below the Gram route's resolution: nothing to prove)
            return (torch.zeros_like(shift, dtype=torch.bool), torch.zeros(idx.shape[0], dtype=torch.int64),
                    torch.ones_like(shift))
        lead = torch.from_numpy(self._take(self.g64, np.ascontiguousarray(idx_np[:, :size]), self._buffers()["b64"]))
        chol, info = _shifted_cholesky(lead, shift.clamp(min=0))
        dep, ceil = _quick_dependent(lead, chol, info, lam_hi, self.rtol, d, shift > 0, ceilings,
                                     full=(trace, dmax, k))
        return dep, info.to(torch.int64), ceil


class _Planner:
    """The plan of chunk j from the chunks 0 .. j - _LAG (the pilot chunks are always among them).
    Running minima are kept per chunk, so plans do not depend on the order they are asked for."""

    def __init__(self, n_pilot: int, can32: bool, prove: bool, probe: int, reach: float | None = None,
                 lead_k: int | None = None):
        self.n_pilot, self.can32, self.prove, self.probe = n_pilot, can32, prove, probe
        self.reach = reach
        self.lead_k = lead_k  # k where stage 0b may run (with dependence proofs), else None
        self.floors: list[float] = []  # smallest margin over chunks 0 .. i
        self.tried: list[_Chunk | None] = []  # the last chunk <= i that ran stage 0
        self.reached: list[_Chunk | None] = []  # the last chunk <= i that certified at the reach

    def __call__(self, j: int, done: list) -> _Plan:
        top = max(self.n_pilot, j - _LAG + 1) - 1  # the last chunk this plan may look at
        while len(self.floors) <= top:
            i = len(self.floors)
            ch = done[i]
            self.floors.append(min(self.floors[-1], ch.min_margin) if i else ch.min_margin)
            self.tried.append(ch if ch.tried32 else (self.tried[-1] if i else None))
            self.reached.append(ch if ch.reach_miss is not None else (self.reached[-1] if i else None))
        last = done[top]
        floor = self.floors[top] if math.isfinite(self.floors[top]) else None
        use32 = False
        if self.can32 and floor is not None:
            # float32 until a chunk shows that it certifies less than half of the chunk, and then
            # while it certifies at least half of the last chunk that tried it; otherwise on every
            # ``probe``-th chunk only
            tried = self.tried[top]
            use32 = tried is None or tried.rate32 >= 0.5 or (j - self.n_pilot) % self.probe == 0
        # Stage 1b first pays when most subsets are dependent and its shortcut (after a failed stage 1
        # factorisation) does not settle them: above 1/2 of them when every full-rank subset needs a
        # margin bound anyway; above 2/3 at a floor, where stage 1b costs a power iteration (about one
        # factorisation) plus a factorisation, against one factorisation at the floor.
        share = 2 / 3 if floor is not None else 1 / 2
        settled = last.shortcut / max(1, last.stages["cholesky_dependent"])
        dependent_first = self.prove and last.dependent_share > share and settled < 0.5
        # the reach while few subsets (at most 1 in 8) need the second factorisation at the floor,
        # otherwise on every ``probe``-th chunk only, and while at most 3 in 4 subsets are dependent
        # (a dependent subset fails at the reach and again at the floor: not where most are dependent)
        reach = None
        if self.reach is not None and floor is not None and self.reach > floor and last.dependent_share < 0.75:
            reached = self.reached[top]
            if reached is None or reached.reach_miss <= 0.125 or (j - self.n_pilot) % self.probe == 0:
                reach = self.reach
        # Stage 0b without stage 0: while at least 3 in 10 subsets of a chunk are settled by the
        # shortcut at a pivot within _LEAD_SHARE k (their proof then reads about (m / k)^2 of the block and
        # factorises (m / k)^3 of it; the others pay the m x m gather and factorisation once more)
        lead = None
        if self.lead_k is not None and not use32 and last.fail_at is not None and last.fail_at.numel():
            at = last.fail_at.sort().values
            m = int(at[(9 * (at.numel() - 1)) // 10]) + _LEAD_PAD64  # 90% of them within m rows
            if m <= _LEAD_SHARE * self.lead_k and int((at + _LEAD_PAD64 <= m).sum()) >= 0.3 * last.rank.numel():
                lead = m
        return _Plan(floor=floor, use32=use32, dependent_first=dependent_first, reach=reach, lead=lead)


def _decide_chunk(pool: _Pool, idx: torch.Tensor, plan: _Plan, rtol: float, prove: bool,
                  ceilings: bool = False, first: int = 0) -> _Chunk:
    """Stages 0, 1, 1b, 2, 3 for one chunk of subsets ``idx`` (c, k); stage 1b leaves rank -1. The
    ``first`` subsets of the chunk get exact ranks where they are dependent (``exact_first`` of
    :func:`decide`)."""
    c, k = idx.shape
    device = pool.x.device
    rank = torch.full((c,), k, dtype=torch.int64, device=device)
    margin = torch.full((c,), math.inf, dtype=torch.float64, device=device)
    stages = _new_stages()
    bound = torch.zeros(c, dtype=torch.bool, device=device)
    ceiling = torch.full((c,), math.inf, dtype=torch.float64, device=device) if ceilings else None
    todo = None
    rate32 = 0.0
    shortcut = 0
    fail_at = torch.zeros(c, dtype=torch.int64, device=device)
    lead = prove and pool.numpy  # stage 0b
    decided = torch.zeros(c, dtype=torch.bool, device=device)

    def settle(pos: torch.Tensor, dep: torch.Tensor, at: torch.Tensor, ceil: torch.Tensor) -> None:
        nonlocal shortcut
        pos = pos[dep]
        rank[pos] = -1
        margin[pos] = math.nan
        fail_at[pos] = at[dep]
        if ceiling is not None:
            ceiling[pos] = ceil[dep]
        decided[pos] = True
        stages["cholesky_dependent"] += int(pos.numel())
        shortcut += int(pos.numel())

    if plan.use32:
        at = plan.reach if plan.reach is not None else plan.floor
        ok, info32, gersh_up = pool.certify32(idx, at, detail=True) if lead else (pool.certify32(idx, at), None, None)
        margin[ok] = at
        bound[ok] = True
        decided |= ok
        stages["cholesky32"] = int(ok.sum())
        rate32 = stages["cholesky32"] / c
        if lead:  # rows up to the float32 factorisation's failing pivot, and a few more
            need = info32.to(torch.int64) + _LEAD_PAD
            cand = ~ok & (info32 > 0) & (need <= _LEAD_SHARE * k)
            cand[:first] = False  # (those get exact ranks)
            if bool(cand.any()):
                pos = cand.nonzero().flatten()
                settle(pos, *pool.dependent_lead(idx[pos], int(need[pos].max()), gersh_up[pos], ceilings))
    elif lead and plan.lead is not None and first < c:
        pos = torch.arange(first, c, device=device)
        settle(pos, *pool.dependent_lead(idx[pos], plan.lead, None, ceilings))
    if bool(decided.any()):
        todo = (~decided).nonzero().flatten()
    if todo is None or todo.numel():
        sub = idx if todo is None else idx[todo]
        gram = pool.gram64(sub)
        early = None
        if prove and first > 0:
            early = torch.arange(c, device=device) < first
            early = early if todo is None else early[todo]
        dec = decide(gram, lambda pos, sub=sub: pool.x[sub[pos]], rtol, pool.d, lam_cap=pool.lam_cap,
                     exact_dependent=0 if prove else None, dependent_first=plan.dependent_first,
                     floor=plan.floor, reach=plan.reach, ceilings=ceilings, exact_first=early)
        if todo is None:
            rank, margin, bound, ceiling = dec.rank, dec.margin, dec.bound, dec.ceiling
        else:
            rank[todo], margin[todo], bound[todo] = dec.rank, dec.margin, dec.bound
            if ceiling is not None:
                ceiling[todo] = dec.ceiling
        for key, value in dec.stages.items():
            stages[key] += value
        shortcut += dec.shortcut
        if todo is None:
            fail_at = dec.fail_at
        else:
            fail_at[todo] = dec.fail_at
    known = margin[(rank >= 0) & ~margin.isnan()]
    reach_miss = None
    if plan.reach is not None:
        reach_miss = float((bound & (rank == k) & (margin < plan.reach)).sum()) / c
    return _Chunk(rank=rank, margin=margin, stages=stages, bound=bound,
                  min_margin=float(known.min()) if known.numel() else math.inf, tried32=plan.use32,
                  rate32=rate32, dependent_share=float((rank != k).sum()) / c, shortcut=shortcut,
                  ceiling=ceiling, reach_miss=reach_miss, fail_at=fail_at[fail_at > 0])


def _run_chunks(bounds, done: list, work: Callable, plan_of, workers: int,
                on_chunk: Callable[[int], None] | None, lag: int = _LAG) -> None:
    """Run ``work(j, plan_of(j, done))`` for the chunks after the first ``len(done)`` (already done)
    on ``workers`` threads with one torch thread each (restored afterwards), into ``done``. Chunk j
    starts once every chunk <= j - ``lag`` is done, so its plan never depends on timing. Progress is
    reported from the calling thread."""
    n = len(bounds)
    start = len(done)
    done.extend([None] * (n - start))
    state = {"next": start, "prefix": start, "error": None, "stop": False}
    cond = threading.Condition()
    threads_before = torch.get_num_threads()
    per_worker = max(1, threads_before // workers)

    def prefix() -> int:
        while state["prefix"] < n and done[state["prefix"]] is not None:
            state["prefix"] += 1
        return state["prefix"]

    def worker() -> None:
        torch.set_num_threads(per_worker)
        while True:
            with cond:
                j = state["next"]
                if j >= n or state["error"] is not None or state["stop"]:
                    return
                state["next"] += 1
                cond.wait_for(lambda j=j: state["error"] is not None or state["stop"] or prefix() > j - lag)
                if state["error"] is not None or state["stop"]:
                    return
                plan = plan_of(j, done)
            try:
                result = work(j, plan)
            except Exception as exc:  # noqa: BLE001 -- re-raised in the calling thread
                with cond:
                    state["error"] = exc
                    cond.notify_all()
                return
            with cond:
                done[j] = result
                cond.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    try:
        for t in threads:
            t.start()
        reported = start
        with cond:
            while True:
                cond.wait_for(lambda r=reported: state["error"] is not None or prefix() > r)
                if state["error"] is not None:
                    break
                top = prefix()
                if on_chunk is not None:
                    cond.release()
                    try:
                        on_chunk(int(bounds[top - 1][1] - bounds[reported][0]))
                    finally:
                        cond.acquire()
                reported = top
                if reported >= n:
                    break
        for t in threads:
            t.join()
    finally:
        with cond:  # on an interrupt, the workers finish their chunk and stop
            state["stop"] = True
            cond.notify_all()
        torch.set_num_threads(threads_before)
    if state["error"] is not None:
        raise state["error"]


def map_chunks(work: Callable[[int], Any], count: int, workers: int) -> list:
    """[work(0), ..., work(count - 1)], on ``workers`` threads with one torch thread each (in the
    calling thread when that is 1 or there is a single item); the order of the results is fixed."""
    if min(workers, count) <= 1:
        return [work(j) for j in range(count)]
    out: list = []
    _run_chunks([(j, j + 1) for j in range(count)], out, lambda j, _plan: work(j), lambda j, done: None,
                min(workers, count), None, lag=count)
    return out


def subset_decisions(
    vectors64: torch.Tensor,
    subsets: torch.Tensor,
    rtol: float,
    pool_gram: torch.Tensor | None,
    *,
    lam_cap: float | None = None,
    exact_dependent: int | None = None,
    on_chunk: Callable[[int], None] | None = None,
    workers: int | None = None,
    reach: float | None = None,
    ceilings: bool = False,
) -> Decisions:
    """Decide every k-subset of a pool.

    Args:
        vectors64: (N, d) float64 pool.
        subsets: (S, k) int64 row indices (on the pool's device).
        pool_gram: (N, N) float64 Gram of the whole pool, or None to form each subset's Gram by bmm.
        lam_cap: sigma_1^2 of the pool (bounds every subset's lambda_max), or None.
        exact_dependent: see :func:`decide`; the first this many dependent subsets (in subset
            order) get exact ranks, beside those the fast path decides exactly anyway. Subsets among the
            first this many that fail their certificate go straight to the exact stages (they would get
            an exact rank after their proof in any case).
        on_chunk: called with the number of subsets after each chunk is decided (progress), or None.
        workers: threads for the chunks (CPU); None: up to ``torch.get_num_threads()`` when the work is
            large enough. Results do not depend on it.
        reach, ceilings: see :func:`decide` (for :mod:`probes.robust`; ranks do not depend on them).
            The reach is given up while more than 1 in 8 subsets of a chunk fall short of it or more
            than 3 in 4 are dependent.

    Returns:
        :class:`Decisions`; certified margins are lower bounds (the margin floor, see the module
        docstring), and their minimum over known ranks is a proven lower bound on the smallest margin.
    """
    s, k = subsets.shape
    d = vectors64.shape[1]
    device = vectors64.device
    step = max(1, min(_MAX_CHUNK, _CACHE_BYTES // (8 * k * k)))
    pool = _Pool(vectors64, pool_gram, k, rtol, lam_cap, step)
    prove = exact_dependent is not None and k > 1
    if s == 0:
        return Decisions(torch.full((0,), k, dtype=torch.int64, device=device),
                         torch.full((0,), math.inf, dtype=torch.float64, device=device), _new_stages(),
                         bound=torch.zeros(0, dtype=torch.bool, device=device),
                         ceiling=torch.zeros(0, dtype=torch.float64, device=device) if ceilings else None)
    # the first subsets get margin bounds each (no floor yet): _PILOT, fewer for large k
    pilot = min(s, max(4, min(_PILOT, int(_PILOT_FLOP / k**3))))
    bounds = [(a, min(a + step, pilot)) for a in range(0, pilot, step)]
    n_pilot = len(bounds)
    bounds += [(a, min(a + step, s)) for a in range(pilot, s, step)]
    probe = max(1, _PROBE_SUBSETS // step)

    first = exact_dependent if prove and exact_dependent else 0  # subsets 0 .. first - 1: see below

    def work(j: int, plan: _Plan) -> _Chunk:
        a, b = bounds[j]
        return _decide_chunk(pool, subsets[a:b], plan, rtol, prove, ceilings, max(0, min(b, first) - a))

    plan_of = _Planner(n_pilot, pool.can32, prove, probe, reach, k if prove else None)

    chunks = []
    for j in range(n_pilot):
        chunks.append(work(j, _Plan(floor=None, use32=False, dependent_first=False)))
        if on_chunk is not None:
            on_chunk(bounds[j][1] - bounds[j][0])
    if workers is None:
        big = (s - pilot) * k * k * (k + 16) >= _MIN_PARALLEL_FLOP
        workers = min(_MAX_WORKERS, torch.get_num_threads()) if device.type == "cpu" and big else 1
    workers = max(1, workers) if device.type == "cpu" else 1
    if min(workers, len(bounds) - n_pilot) > 1:
        _run_chunks(bounds, chunks, work, plan_of, min(workers, len(bounds) - n_pilot), on_chunk)
    else:
        for j in range(n_pilot, len(bounds)):
            chunks.append(work(j, plan_of(j, chunks)))
            if on_chunk is not None:
                on_chunk(bounds[j][1] - bounds[j][0])
    rank = torch.cat([ch.rank for ch in chunks])
    margin = torch.cat([ch.margin for ch in chunks])
    bound = torch.cat([ch.bound for ch in chunks])
    ceiling = torch.cat([ch.ceiling for ch in chunks]) if ceilings else None
    stages = {key: sum(ch.stages[key] for ch in chunks) for key in STAGE_KEYS}
    shortcut = sum(ch.shortcut for ch in chunks)
    if prove and exact_dependent:
        # exact ranks for the first ``exact_dependent`` dependent subsets, in subset order: those among
        # subsets 0 .. exact_dependent - 1 got them without a dependence proof (they cannot fall
        # beyond that budget); the others proven dependent get them now
        order = (rank != k).nonzero().flatten()[:exact_dependent]
        chosen = order[rank[order] == -1]
        pieces = [(a, min(a + step, chosen.numel())) for a in range(0, chosen.numel(), step)]

        def exact(j: int) -> Decisions:
            sub = subsets[chosen[pieces[j][0] : pieces[j][1]]]
            gram = pool.gram64(sub)
            out = Decisions(torch.empty(sub.shape[0], dtype=torch.int64, device=device),
                            torch.empty(sub.shape[0], dtype=torch.float64, device=device), _new_stages(),
                            ceiling=torch.empty(sub.shape[0], dtype=torch.float64, device=device))
            _stage_exact(gram, torch.arange(sub.shape[0], device=device), lambda p: vectors64[sub[p]],
                         _lam_hi(gram, lam_cap), rtol, d, out.rank, out.margin, out.stages, out.ceiling)
            return out

        parts = map_chunks(exact, len(pieces), workers)
        for (a, b), part in zip(pieces, parts, strict=True):
            rank[chosen[a:b]], margin[chosen[a:b]] = part.rank, part.margin
            bound[chosen[a:b]] = False
            if ceiling is not None:
                ceiling[chosen[a:b]] = part.ceiling
            for key, value in part.stages.items():
                stages[key] += value
    return Decisions(rank, margin, stages, shortcut, bound, ceiling)


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
        torch.cat([p.rank for p in parts]), torch.cat([p.margin for p in parts]), stages,
        bound=torch.cat([p.bound for p in parts]),
    )
