"""Certified two-sided facts about a set of vectors: a proven lower bound on its Kruskal rank, an exact
confidence interval for a sampled pass rate, and counts of duplicated vectors.

A sampled Kruskal test (:func:`probes.kruskal_test`) reports the share of random k-subsets that are
full rank. One dependent subset proves Kruskal rank < k, but no number of passing samples proves
Kruskal rank >= k. Two things fill that gap:

- :func:`clopper_pearson`: the exact binomial confidence interval of the pass rate, i.e. of the share of
  ALL k-subsets that are full rank (a statement about the population of subsets, not a proof);
- :func:`kruskal_lower_bound`: a proof that EVERY k-subset is full rank for k up to a bound, from an
  exhaustive search of the small k, the mutual coherence and the Babel function of the vectors, the
  same two after whitening, and a null-space bound from linear programs (:mod:`probes.spark`).

The coherence and Babel bounds of the raw vectors are worst-case bounds: on strongly correlated vectors
(most trained transformer tokens) they certify only 1 or 2. Whitening removes the shared directions
that make every cosine ~1 (the Kruskal rank does not change under an invertible map, and the
numerical tolerance is carried through the map's distortion), which often proves much more; where
even that stops far below what sampling suggests, the result says so in its ``note``.

Ranks are numerical, with the rule of :func:`probes.numerical_rank`: a k-subset is full rank at
relative tolerance rtol when ``sigma_k > rtol * sigma_1`` of that (k, d) matrix, by default
``rtol = max(k, d) * eps`` of the dtype the vectors were given in.

The Gershgorin bounds. Mutual coherence mu = max |cos(x_i, x_j)| over distinct vectors, and the Babel
function mu_1(m) = max_i (sum of the m largest |cos(x_i, x_j)|, j != i) <= m mu. Let S be a k-subset,
U_S its rows normalised to unit length and D_S = diag(|x_i|), so X_S = D_S U_S. The Gram U_S U_S^T has
unit diagonal and off-diagonal row sums at most mu_1(k - 1); by Gershgorin its eigenvalues lie in
[1 - mu_1(k - 1), 1 + mu_1(k - 1)]. Hence, with r_min and r_max the smallest and largest norm of all N
vectors, ``sigma_k(X_S) / sigma_1(X_S) >= (r_min / r_max) sqrt((1 - mu_1(k-1)) / (1 + mu_1(k-1)))``,
and every k-subset is full rank when this exceeds rtol_k. The coherence bound is the same argument
with mu_1(k - 1) replaced by (k - 1) mu (in exact arithmetic: Kruskal rank >= 1/mu).

Rounding. Cosines are computed in float64 from unit rows; each carries an error below
``4 (d + 4) eps64``, added per term to the Babel sums (and their own summation error), the norm ratio
is lowered by its rounding, and k passes only with a further ``64 (k + d) eps64`` to spare, so that
the bound holds for the exact singular values and for the float64 SVD verdict alike.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from probes.kruskal import kruskal_test, pool64, validate_vectors
from probes.rank import Array, check_int, numerical_rank, pow2_rescale, resolve_rtol
from probes.spark import (
    BABEL_FIRST_COLUMNS,
    REFINE_STEPS,
    Cosines,
    cosine_pass,
    nullspace_bound,
    spectrum,
    unit_rows,
    whitened_bound,
)

EPS64 = torch.finfo(torch.float64).eps
# the proofs behind a lower bound, in the order that breaks ties (the simpler proof first)
METHODS = ("trivial", "coherence", "babel", "whitened-coherence", "whitened-babel", "nullspace", "exhaustive")
NULLSPACE_SECONDS = 10.0  # default wall-time cap of the null-space linear programs, per call
WIDE_RANGE = 2.0**-60  # pools whose smallest norm is below this share of the largest are not whitened


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) two-sided confidence interval of a binomial proportion.

    With ``alpha = 1 - confidence``, the interval is ``[B(alpha/2; s, n - s + 1), B(1 - alpha/2;
    s + 1, n - s)]`` with ``B`` the quantile function of the Beta distribution, and 0 (1) as the lower
    (upper) end when s = 0 (s = n). It covers the true proportion with probability at least
    ``confidence`` (Clopper and Pearson, Biometrika 1934). Computed by
    ``scipy.stats.binomtest(...).proportion_ci(method="exact")``.

    For a sampled Kruskal test, ``successes = full_rank`` and ``trials = subsets`` bound the share of
    all k-subsets that are full rank (subsets drawn with replacement between draws; for an exhaustive
    test the share is known exactly and the interval is not needed).

    Args:
        successes: 0 <= successes <= trials (Python or NumPy integer).
        trials: a positive integer.
        confidence: in (0, 1).

    Returns:
        ``(lower, upper)`` as floats in [0, 1].
    """
    trials = check_int(trials, "trials")
    successes = check_int(successes, "successes", minimum=0)
    if successes > trials:
        raise ValueError(
            f"successes = {successes} exceeds trials = {trials}; valid: 0 <= successes <= trials"
        )
    if (isinstance(confidence, bool | np.bool_) or not isinstance(confidence, numbers.Real)
            or not 0 < confidence < 1):
        raise ValueError(f"confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")
    ci = stats.binomtest(successes, trials).proportion_ci(confidence_level=float(confidence), method="exact")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True, repr=False)
class KruskalLowerBound:
    """A certified lower bound on the numerical Kruskal rank of N vectors in R^d.

    Attributes:
        lower: every k-subset with k <= lower is proven full rank at ``rtol`` (0 when a vector is zero
            or rtol >= 1; 1 when no vector is zero and nothing better is proven).
        method: the proof behind ``lower``, one of :data:`METHODS`: "exhaustive" (every subset tested),
            "nullspace" (linear programs), "whitened-babel" or "whitened-coherence" (Gershgorin bounds
            after whitening), "babel" or "coherence" (Gershgorin bounds on the raw vectors), or
            "trivial" (single vectors). Ties go to the simpler proof.
        exact: ``lower`` IS the numerical Kruskal rank (the search found a dependent (lower + 1)-subset,
            ``lower`` reached min(N, d), or a vector is zero).
        k_max: the largest k that was to be certified (the search stops there).
        N, d: number and width of the vectors.
        coherence: the mutual coherence, largest |cosine| between two distinct vectors (NaN for N = 1;
            cosines with a zero vector count as 0).
        coherence_k, babel_k: what the coherence and the Babel bound prove on their own.
        whitened_coherence_k, whitened_babel_k: what the coherence and Babel bounds of the whitened
            vectors prove (best over the whitenings tried; 1 when not tried).
        whitened_coherence: coherence of the whitened unit vectors of the best whitening (NaN if none).
        nullspace_k: what the null-space bound proves (1 when not tried, stopped or beaten).
        nullspace_programs: linear programs solved for it (one per vector when it completes).
        exhaustive_k: how far the exhaustive search certified: it starts above what the other bounds
            prove and tests every k-subset, level by level, while ``max_subsets`` allows.
        subsets: how many subsets were tested (single vectors included).
        norm_ratio: smallest over largest vector norm (the Gershgorin bounds scale with it).
        rtol: the relative tolerance (for k <= d the default ``max(k, d) * eps`` is the same for all k).
        witness: indices of a dependent subset of size lower + 1 (proof that the Kruskal rank is not
            larger), found by the search, or the most coherent pair when it is dependent; else None.
        seconds: wall time.
        note: in words, why the bound stops where it does (empty when it is exact).
    """

    lower: int
    method: str
    exact: bool
    k_max: int
    N: int
    d: int
    coherence: float
    coherence_k: int
    babel_k: int
    exhaustive_k: int
    subsets: int
    norm_ratio: float
    rtol: float
    witness: tuple[int, ...] | None
    seconds: float
    whitened_coherence_k: int = 1
    whitened_babel_k: int = 1
    whitened_coherence: float = math.nan
    nullspace_k: int = 1
    nullspace_programs: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Flat dict of plain values: ints, floats, bools, strings; ``witness`` a list of ints or None."""
        out = asdict(self)
        out["witness"] = None if self.witness is None else [int(i) for i in self.witness]
        return out

    def __repr__(self) -> str:
        what = "=" if self.exact else ">="
        text = (
            f"KruskalLowerBound(N={self.N}, d={self.d}: Kruskal rank {what} {self.lower} by {self.method}; "
            f"coherence={self.coherence:.4g}, coherence_k={self.coherence_k}, babel_k={self.babel_k}, "
            f"whitened_coherence_k={self.whitened_coherence_k}, whitened_babel_k={self.whitened_babel_k}, "
            f"nullspace_k={self.nullspace_k}, exhaustive_k={self.exhaustive_k} ({self.subsets} subsets)"
        )
        return text + (f"; {self.note}" if self.note else "") + ")"


def _unit_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 unit rows (zero rows stay zero) and the base-2 logarithms of the row norms (-inf for a
    zero row), each row computed at its own scale where the pool's range needs it: every row is then
    rescaled by an exact power of two, so that no square underflows (a vector 1e-170 times the largest
    keeps its direction and its norm) and the cosines are those of the rows as given."""
    x64 = pool64(x)  # (N, d), one power of two for all when the squares of its largest would leave float64
    scaled, e = pow2_rescale(x64, (1,))  # (each row its own power of two, where some row needs it)
    unit, norms = unit_rows(scaled)
    log2 = torch.log2(norms)
    return unit, log2 if e is None else log2 + e[:, 0].to(log2.dtype)


def _gershgorin_passes(bound: torch.Tensor, ks: torch.Tensor, ratio: float, rtols: torch.Tensor,
                       d: int) -> int:
    """Largest k in ``ks`` (consecutive, from 2) up to which every k passes, given a rigorous upper
    bound ``bound[i] >= mu_1(ks[i] - 1)`` on the Gershgorin radius; 1 when none passes.

    A k passes when ``bound < 1`` and ``ratio * sqrt((1 - bound) / (1 + bound))``, less its rounding,
    exceeds ``rtol_k`` plus the float64 error of the SVD verdict it stands for (``64 (k + d) eps``)."""
    below = bound < 1
    safe = torch.where(below, bound, 0.0)
    sv_ratio = ratio * torch.sqrt((1 - safe) / (1 + safe)) * (1 - 8 * EPS64)  # (K,) lower bounds
    slack = 64 * (ks + d).double() * EPS64
    passes = below & (sv_ratio > rtols + slack)
    failed = (~passes).nonzero()
    return int(ks[-1]) if failed.numel() == 0 else int(ks[int(failed[0])]) - 1


@dataclass(frozen=True)
class _RawBounds:
    """What the Gershgorin bounds of the raw vectors prove (steps (b), (c) of :func:`kruskal_lower_bound`)."""

    coherence_k: int
    babel_k: int
    babel_bound: torch.Tensor | None  # (columns,) rigorous upper bounds on mu_1(m), m = 1..columns
    cos: Cosines  # the last cosine pass: coherence and the most coherent pair
    pair_dependent: bool  # nothing beyond 1 proven, and the most coherent pair (or the pair of the
    # smallest and largest norm) was tested and is dependent
    pair: tuple[int, int] | None = None  # that dependent pair


def _raw_bounds(x: torch.Tensor, unit: torch.Tensor, ratio: float, rtols: list[float],
                top: int, log2_norms: torch.Tensor) -> _RawBounds:
    """The coherence and Babel bounds for k = 2..top of the vectors ``x`` (N, d) with unit rows ``unit``
    (N, d) and rounded-down norm ratio ``ratio``; the Babel columns grow until the bound stops passing.
    When neither proves 2, the most coherent pair is tested with a float64 SVD, then the pair of the
    smallest and the largest norm (``log2_norms`` (N,)), whose ratio sigma_2 / sigma_1 is at most theirs
    (the argument and its rounding allowances: the module docstring)."""
    d = x.shape[1]
    babel_k = coherence_k = 1
    babel_bound = None
    columns = min(BABEL_FIRST_COLUMNS, top - 1)
    cos = cosine_pass(unit, columns)
    if top >= 2:
        ks = torch.arange(2, top + 1, device=unit.device)  # (top - 1,)
        rtol_k = torch.tensor(rtols[1:], dtype=torch.float64, device=unit.device)  # (top - 1,)
        delta = 4 * (d + 4) * EPS64  # rounding allowance per cosine
        while True:
            m = torch.arange(1, columns + 1, dtype=torch.float64, device=unit.device)  # (columns,)
            babel_bound = cos.babel * (1 + 2 * m * EPS64) + m * delta
            babel_k = _gershgorin_passes(babel_bound, ks[:columns], ratio, rtol_k[:columns], d)
            if babel_k <= columns or columns == top - 1:  # stopped within these columns, or all done
                break
            columns = min(4 * columns, top - 1)
            cos = cosine_pass(unit, columns)
        mu = (cos.coherence + delta) * (1 + 2 * EPS64)
        coherence_k = _gershgorin_passes((ks - 1).double() * mu, ks, ratio, rtol_k, d)
    # the most coherent pair: often dependent (e.g. duplicated vectors), and then nothing proves 2
    pair_dependent, pair = False, None
    if top >= 2 and max(babel_k, coherence_k) == 1:
        spread = (int(log2_norms.argmin()), int(log2_norms.argmax()))
        pairs = [tuple(sorted(cos.pair)), tuple(sorted(spread))]
        for i, j in pairs[:1] if pairs[1] == pairs[0] else pairs:
            if i != j and int(numerical_rank(x[[i, j]], rtols[1]).rank) < 2:
                pair_dependent, pair = True, (i, j)
                break
    return _RawBounds(coherence_k, babel_k, babel_bound, cos, pair_dependent, pair)


def _search_first(n_vec: int, d: int, proven: int, top: int, max_subsets: int, whiten: bool,
                  seconds: float, steps: int) -> bool:
    """Whether the exhaustive search goes before the whitened and null-space bounds: when every level
    above ``proven`` fits ``max_subsets`` and its cost estimate (a k x k Gram block and its factorisation
    per subset, in flops) is below theirs (a few N x N cosine passes, ``steps`` first-order steps of
    O(N^2 d) and the linear programs' ``seconds`` at about 1e9 flops a second). On a small pool (12
    vectors in R^6: 2,443 subsets) the search then answers exactly in a fraction of a second."""
    if not whiten or proven >= top:
        return False
    count = n_vec + sum(math.comb(n_vec, k) for k in range(proven + 1, top + 1))
    if count > max_subsets:
        return False
    search = sum(math.comb(n_vec, k) * (k * k * d + k**3) for k in range(proven + 1, top + 1))
    proofs = 6 * n_vec**2 * d + n_vec * d * d + steps * n_vec**2 * (d + 32) + 1e9 * seconds
    return search <= proofs


def _exhaustive_search(x: torch.Tensor, proven: int, top: int, max_subsets: int,
                       rtol: float | None) -> tuple[int, int, tuple[int, ...] | None]:
    """Step (a) of :func:`kruskal_lower_bound`: test every k-subset of ``x`` (N, d) for k = proven + 1 ..
    top while the total, the N single vectors included, stays within ``max_subsets``. Returns (the
    largest k certified, subsets tested, a dependent subset or None)."""
    n_vec = x.shape[0]
    exhaustive_k, tested, witness = proven, n_vec, None  # single vectors are settled (none is zero)
    for k in range(exhaustive_k + 1, top + 1):
        count = math.comb(n_vec, k)
        if tested + count > max_subsets:
            break
        res = kruskal_test(x, k, subsets=count, rtol=rtol, rank_sample=0, progress=False)
        tested += count
        if res.full_rank < count:
            witness = res.witness
            break
        exhaustive_k = k
    return exhaustive_k, tested, witness


def kruskal_lower_bound(
    vectors: Array, k_max: int | None = None, rtol: float | None = None, *, max_subsets: int = 20000,
    whiten: bool = True, nullspace_seconds: float = NULLSPACE_SECONDS, nullspace_steps: int = REFINE_STEPS,
) -> KruskalLowerBound:
    """A certified lower bound on the numerical Kruskal rank: every k-subset with k <= ``lower`` is
    proven full rank at ``rtol``.

    Five proofs, the best one wins (ties go to the simpler one):

    (a) Exhaustive search: every k-subset for k = 2, 3, ... above what (b)-(e) prove, while the total
        stays within ``max_subsets``, with the verdicts of :func:`probes.kruskal_test` (equal to a
        float64 SVD at the same tolerance). A dependent subset ends the search with the exact rank.
    (b) Mutual coherence and (c) the Babel function of the raw vectors bound the singular values of
        every k-subset by Gershgorin's theorem (the argument and its rounding allowances are in the
        module docstring): ``"coherence"``, ``"babel"``.
    (d) The coherence and Babel bounds of the vectors after clipped whitenings (``"whitened-coherence"``,
        ``"whitened-babel"``), and (e) a null-space bound (``"nullspace"``): one dual certificate per
        vector bounds every entry of a null vector, and k is proven when the k largest of those bounds
        sum below 1 (spark >= 1 / alpha in exact arithmetic); the certificates are refined by
        ``nullspace_steps`` first-order steps for all vectors at once, then by linear programs within
        ``nullspace_seconds``. Both made valid at rtol with the proofs in :mod:`probes.spark`. They run
        only while (b) and (c) leave k below min(k_max, d); (e) only when (d) did not reach it either.

    When (b) and (c) prove nothing beyond 1, the two vectors of largest |cosine| are tested first
    (float64 SVD); if they are dependent (e.g. a duplicated vector), the Kruskal rank is exactly 1 and
    (d), (e) are skipped.

    Work: one pass over the N x N cosine matrix in blocks of rows (the Babel function needs the top
    k_max - 1 cosines of each row: O(N^2 log N)), plus at most ``max_subsets`` subset tests. N = 2000,
    d = 1280 takes a few seconds on one CPU core. Whitening adds the SVD of the pool and up to five
    more cosine passes; the null-space bound ``nullspace_steps`` passes of O(N^2 d) (about 10 s of one
    core for N = 1000, d = 384) and at most ``nullspace_seconds`` of linear programs (stopped by that cap
    it is lower, never invalid). The refinement runs in float32 on the pool's device, so its value can
    differ in the last step between BLAS builds or thread counts; the bound is rigorous either way.

    Args:
        vectors: (N, d) tensor (CPU or CUDA) or NumPy array; computed in float64 on its device.
        k_max: stop once k_max is certified (e.g. the n of Assumption 1); default min(N, d). 1..N.
        rtol: relative tolerance; default ``max(k, d) * eps`` of the vectors' dtype (as the Kruskal
            tests use).
        max_subsets: most subsets the exhaustive search may test in all, single vectors included
            (0: none beyond the single vectors).
        whiten: try (d) and (e); False gives the bounds (a)-(c) only.
        nullspace_seconds: wall-time cap of the linear programs of (e), >= 0 (0: skip (e)).
        nullspace_steps: first-order steps that improve every certificate of (e) at once before the
            linear programs, >= 0 (a count, so the bound does not depend on the machine's speed).

    Returns:
        :class:`KruskalLowerBound`. Where even the whitened bounds stop far below what sampled tests
        suggest, the ``note`` says so.

    Raises:
        ValueError: not a finite non-empty (N, d) array, k_max outside 1..N, bad rtol, max_subsets or
            nullspace_seconds.
    """
    start = time.perf_counter()
    x = validate_vectors(vectors)
    n_vec, d = x.shape
    k_max, max_subsets, nullspace_steps = _check_limits(k_max, n_vec, d, max_subsets, nullspace_seconds,
                                                        nullspace_steps)
    top = min(k_max, d)  # no d + 1 vectors in R^d are independent
    rtols = [resolve_rtol(rtol, k, d, x.dtype) for k in range(1, top + 1)]
    common = dict(k_max=k_max, N=n_vec, d=d, rtol=rtols[0])

    unit, log2_norms = _unit_rows(x)
    zero = ~(x != 0).any(dim=1)
    ratio = _norm_ratio(log2_norms, bool(zero.any()), d)
    if bool(zero.any()) or rtols[0] >= 1:
        first = int(zero.nonzero()[0]) if bool(zero.any()) else 0
        why = (f"vector {first} is zero" if bool(zero.any())
               else f"rtol = {rtols[0]:.3g} >= 1 rejects even single vectors")
        return _rank_zero(unit, ratio, why, start, common, witness=(first,))

    raw = _raw_bounds(x, unit, ratio, rtols, top, log2_norms)
    (white_c, white_b, null_k, white_mu, programs, extra_note), (exhaustive_k, tested, witness) = \
        _beyond_raw(x, raw, ratio, rtols, top, rtol, max_subsets, whiten, nullspace_seconds, nullspace_steps)

    found = {"trivial": 1, "coherence": raw.coherence_k, "babel": raw.babel_k, "whitened-coherence": white_c,
             "whitened-babel": white_b, "nullspace": null_k, "exhaustive": exhaustive_k}
    lower = max(found.values())
    exact = witness is not None or lower == min(n_vec, d)
    whitened = (max(white_c, white_b), null_k, extra_note) if whiten else None
    note = "" if exact else _why_not_more(lower, top, k_max, raw, ratio, rtols, n_vec, max_subsets, whitened)
    return KruskalLowerBound(
        lower=lower, method=next(m for m in METHODS if found[m] == lower), exact=exact,
        coherence=raw.cos.coherence, coherence_k=raw.coherence_k, babel_k=raw.babel_k,
        exhaustive_k=exhaustive_k, subsets=tested, norm_ratio=ratio,
        witness=None if witness is None else tuple(int(i) for i in witness),
        seconds=time.perf_counter() - start, whitened_coherence_k=white_c, whitened_babel_k=white_b,
        whitened_coherence=white_mu, nullspace_k=null_k, nullspace_programs=programs, note=note, **common)


def _norm_ratio(log2_norms: torch.Tensor, any_zero: bool, d: int) -> float:
    """The smallest over the largest row norm, from their base-2 logarithms (N,) (0 with a zero row or
    where it lies below float64's range), lowered by the norms' rounding (each below (d / 2 + 2) eps)."""
    ratio = 0.0 if any_zero else 2.0 ** max(float(log2_norms.min() - log2_norms.max()), -1100.0)
    return ratio * (1 - (d + 8) * EPS64)


def _beyond_raw(x: torch.Tensor, raw: Any, ratio: float, rtols: list[float], top: int, rtol: float | None,
                max_subsets: int, whiten: bool, nullspace_seconds: float, nullspace_steps: int
                ) -> tuple[tuple[int, int, int, float, int, str], tuple[int, int, tuple[int, ...] | None]]:
    """The proofs past the raw bounds ``raw`` of (N, d) ``x``: the whitened and null-space bounds
    (whitened coherence k, whitened Babel k, null-space k, whitened coherence, programs, note) and the
    exhaustive search (k, subsets tested, witness). A small pool is searched first, where the search
    answers exactly for less than the proofs would cost; the proofs (d), (e) run while k is left to prove,
    on pools whose norms span at most 1 / WIDE_RANGE (beyond, the whitened spectra leave float64's range:
    the exhaustive search and (b), (c) remain)."""
    n_vec, d = x.shape
    proven = max(raw.babel_k, raw.coherence_k)
    whitened: tuple[int, int, int, float, int, str] = (1, 1, 1, math.nan, 0, "")
    searched = None
    if not raw.pair_dependent and _search_first(n_vec, d, proven, top, max_subsets, whiten, nullspace_seconds,
                                                nullspace_steps):
        searched = _exhaustive_search(x, proven, top, max_subsets, rtol)
        if searched[2] is None and searched[0] < top:  # (stopped by its budget: the proofs may go further)
            searched = None
    if (whiten and top >= 2 and proven < top and not raw.pair_dependent and ratio >= WIDE_RANGE
            and searched is None):
        whitened = _whitened_and_nullspace(x, rtols, proven, top, float(nullspace_seconds), nullspace_steps)
    exhaustive_k, tested, witness = searched or _exhaustive_search(x, max(proven, *whitened[:3]), top,
                                                                   max_subsets, rtol)
    if witness is None and exhaustive_k == 1 and raw.pair_dependent:
        witness = raw.pair
    return whitened, (exhaustive_k, tested, witness)


def _rank_zero(unit: torch.Tensor, ratio: float, why: str, start: float, common: dict[str, Any],
               witness: tuple[int, ...] | None = None) -> KruskalLowerBound:
    """The exact bound 0 of vectors with unit rows ``unit`` (N, d) where a single vector is already rank
    deficient (``why``; ``witness``: that vector); every proof's own field says 0 too. ``start``: the
    call's perf_counter, ``common``: k_max, N, d and rtol."""
    return KruskalLowerBound(
        lower=0, method="trivial", exact=True, coherence=cosine_pass(unit, 0).coherence, coherence_k=0,
        babel_k=0, exhaustive_k=0, whitened_coherence_k=0, whitened_babel_k=0, nullspace_k=0,
        subsets=unit.shape[0], norm_ratio=max(ratio, 0.0), witness=witness,
        seconds=time.perf_counter() - start, note=f"Kruskal rank 0: {why}", **common)


def _check_limits(k_max: int | None, n_vec: int, d: int, max_subsets: int, nullspace_seconds: float,
                  nullspace_steps: int) -> tuple[int, int, int]:
    """The checked (k_max, max_subsets, nullspace_steps) of :func:`kruskal_lower_bound`, k_max None
    resolved to min(N, d); raises ValueError on a bad one."""
    k_max = check_int(min(n_vec, d) if k_max is None else k_max, "k_max")
    if k_max > n_vec:
        raise ValueError(f"k_max = {k_max} exceeds the number of vectors N = {n_vec}; valid: 1 <= k_max <= N")
    max_subsets = check_int(max_subsets, "max_subsets", minimum=0)
    nullspace_steps = check_int(nullspace_steps, "nullspace_steps", minimum=0)
    if (isinstance(nullspace_seconds, bool | np.bool_) or not isinstance(nullspace_seconds, numbers.Real)
            or not 0 <= nullspace_seconds < math.inf):
        raise ValueError(f"nullspace_seconds must be a finite number >= 0 (0 skips the linear programs), "
                         f"e.g. {NULLSPACE_SECONDS:g}; got {nullspace_seconds!r}")
    return k_max, max_subsets, nullspace_steps


def _why_not_more(lower: int, top: int, k_max: int, raw: _RawBounds, ratio: float, rtols: list[float],
                  n_vec: int, max_subsets: int, whitened: tuple[int, int, str] | None) -> str:
    """One sentence on why the certified bound stops at ``lower`` (< min(N, d)); ``whitened``: what the
    whitened bounds and the null-space bound proved, and the latter's note (None: not tried)."""
    if lower >= top:
        return f"certified up to k_max = {k_max}; larger k not searched"
    k = raw.babel_k + 1  # the first k the Gershgorin bounds could not certify
    babel_bound = raw.babel_bound
    if babel_bound is not None and float(babel_bound[k - 2]) >= 1:
        why = f"the raw Babel function mu_1({k - 1}) = {float(babel_bound[k - 2]):.4g} is not below 1"
    else:
        why = (f"the norm ratio {ratio:.3g} keeps the bound on sigma_{k} / sigma_1 below "
               f"rtol = {rtols[k - 1]:.3g}")
    nxt = lower + 1
    text = (f"certified only k <= {lower} of a possible {top}: raw coherence {raw.cos.coherence:.3g}, {why}, "
            f"and testing all {math.comb(n_vec, nxt):,} {nxt}-subsets exceeds max_subsets = {max_subsets:,}; "
            f"worst-case bounds say no more here, sampled Kruskal tests estimate beyond (no proof)")
    if whitened is not None:
        white_k, null_k, null_note = whitened
        text += (f"; whitening proves {white_k}, the null-space bound {null_k}"
                 + (f" ({null_note})" if null_note else ""))
    return text


@dataclass(frozen=True, repr=False)
class DuplicateCounts:
    """Duplicated and nearly parallel vectors among N.

    Attributes:
        N: number of vectors.
        exact_duplicates: rows equal (bit for bit, up to the sign of zero) to an earlier row.
        near_duplicate_pairs: unordered pairs {i, j}, i != j, with |cosine| >= ``cosine`` (exact
            duplicates included; a zero vector has cosine 0 with everything).
        cosine: the threshold.
        coherence: largest |cosine| between two distinct vectors (NaN for N = 1).
        zero_vectors: rows that are entirely zero.
    """

    N: int
    exact_duplicates: int
    near_duplicate_pairs: int
    cosine: float
    coherence: float
    zero_vectors: int

    def to_dict(self) -> dict[str, Any]:
        """Flat dict of plain ints and floats."""
        return asdict(self)

    def __repr__(self) -> str:
        return (f"DuplicateCounts(N={self.N}: {self.exact_duplicates} exact duplicates, "
                f"{self.near_duplicate_pairs} pairs with |cosine| >= {self.cosine:g}, "
                f"coherence={self.coherence:.6g}, {self.zero_vectors} zero vectors)")


def duplicates(vectors: Array, *, cosine: float = 0.9999) -> DuplicateCounts:
    """Count exactly duplicated vectors and nearly parallel pairs.

    Exact duplicates compare the values as given (any dtype, on their device). Cosines are computed in
    float64 from unit rows, in blocks of rows (memory ~64 MiB whatever N). Two equal vectors have
    |cosine| 1 only up to rounding, hence a threshold below 1.

    Args:
        vectors: (N, d) tensor (CPU or CUDA) or NumPy array.
        cosine: the near-duplicate threshold on |cosine|, in (0, 1); default 0.9999.

    Returns:
        :class:`DuplicateCounts`.
    """
    x = validate_vectors(vectors)
    if isinstance(cosine, bool | np.bool_) or not isinstance(cosine, numbers.Real) or not 0 < cosine < 1:
        raise ValueError(f"cosine must be a number in (0, 1), e.g. 0.9999; got {cosine!r}")
    n_vec = x.shape[0]
    distinct = torch.unique(x + 0, dim=0).shape[0]  # + 0 turns -0.0 into 0.0
    unit, _ = _unit_rows(x)
    cos = cosine_pass(unit, 0, threshold=float(cosine))
    zero = int((~(x != 0).any(dim=1)).sum())
    return DuplicateCounts(N=n_vec, exact_duplicates=n_vec - distinct, near_duplicate_pairs=cos.pairs_above,
                           cosine=float(cosine), coherence=cos.coherence, zero_vectors=zero)


def _whitened_and_nullspace(x: torch.Tensor, rtols: list[float], proven: int, top: int,
                            seconds: float, steps: int) -> tuple[int, int, int, float, int, str]:
    """Steps (d) and (e) of :func:`kruskal_lower_bound` above the ``proven`` Gershgorin bound: (whitened
    coherence k, whitened Babel k, null-space k, whitened coherence, programs solved, note)."""
    sp = spectrum(pool64(x), rtols)
    white = whitened_bound(sp, start=proven)
    proven = max(proven, white.coherence_k, white.babel_k)
    null_k, programs, note = 1, 0, ""
    if (seconds > 0 or steps > 0) and proven < top and white.whitened is not None:
        null = nullspace_bound(sp, white.whitened, start=proven, seconds=seconds, steps=steps)
        null_k, programs, note = null.k, null.solved, null.note
    return white.coherence_k, white.babel_k, null_k, white.coherence, programs, note


class TestedVectors:
    """One set of tested vectors (N, d) with its certified Kruskal lower bound (per rtol) and its duplicates,
    each computed once when first asked: several tests may share their vectors (an audit's Assumption 1 and
    general position both test the queries)."""

    __test__ = False  # not a pytest class

    def __init__(self, vectors: Array) -> None:
        self.vectors = vectors  # (N, d)
        self._lower: dict[float, KruskalLowerBound] = {}
        self._duplicates: DuplicateCounts | None = None

    def lower(self, rtol: float) -> KruskalLowerBound:
        """:func:`kruskal_lower_bound` of the vectors at ``rtol``."""
        if rtol not in self._lower:
            self._lower[rtol] = kruskal_lower_bound(self.vectors, rtol=rtol)
        return self._lower[rtol]

    def duplicates(self) -> DuplicateCounts:
        """:func:`duplicates` of the vectors."""
        if self._duplicates is None:
            self._duplicates = duplicates(self.vectors)
        return self._duplicates


def result_bounds(result: Any, tested: Array | TestedVectors) -> dict[str, Any]:
    """The bounds of a sampled Kruskal test's result (a :class:`probes.KruskalResult` or
    :class:`probes.AssumptionResult` of a Kruskal test) whose tested vectors are ``tested`` (N, d), or their
    :class:`TestedVectors` shared with other tests, at the result's own ``rtol``.

    Returns a flat dict: ``fraction_low`` / ``fraction_high``, the Clopper-Pearson 95% interval of the
    full-rank share (the share itself when every subset was tested or proven dependent at once);
    ``krank_upper``, k - 1 for the smallest dependent subset found (by the test, size k, or by the
    exhaustive search of the lower bound): a witnessed upper bound on the Kruskal rank, else None;
    ``krank_lower`` and ``krank_lower_method``, the certified lower bound (:func:`kruskal_lower_bound`) and
    its proof; ``duplicates`` / ``near_duplicates``: exactly repeated vectors and pairs with |cosine| >=
    0.9999 (:func:`duplicates`).
    """
    k, fraction, subsets = int(result.k), float(result.fraction), int(result.subsets or 0)
    out: dict[str, Any] = {"krank_upper": k - 1 if result.witness else None}
    if result.exhaustive or result.spectrum_proof or subsets == 0:  # every subset tested or proven
        out["fraction_low"] = out["fraction_high"] = fraction
    else:
        out["fraction_low"], out["fraction_high"] = clopper_pearson(round(fraction * subsets), subsets)
    shared = tested if isinstance(tested, TestedVectors) else TestedVectors(tested)
    lower, dup = shared.lower(float(result.rtol)), shared.duplicates()
    if lower.exact and lower.witness is not None:  # its search met a dependent subset
        out["krank_upper"] = min(v for v in (out["krank_upper"], len(lower.witness) - 1) if v is not None)
    return {**out, "krank_lower": int(lower.lower), "krank_lower_method": str(lower.method),
            "duplicates": int(dup.exact_duplicates), "near_duplicates": int(dup.near_duplicate_pairs)}
