"""Every certificate held to brute force: property-based tests on small adversarial pools.

Each example draws a small pool (or a batch of contexts) from the classes that make proofs fail at the
edges: Gaussian pools with N < d and N > d, planted dependent triples and quadruples, subsets placed at
1.01x, 1.001x and 1 +- 1e-6 of the tolerance, duplicated and scaled vectors, row norms from 1e-8 to 1e8
and far beyond (1e-300), rank-deficient and clustered pools, exact zeros, integer and boolean data.
The reference enumerates every k-subset and takes its singular values from a float64 SVD of the rows
(each subset at its own scale, an exact power of two), and from 50-digit arithmetic (mpmath) where
float64 cannot resolve a ratio. Then:

- the certified lower bound never exceeds the Kruskal rank (and equals it where flagged exact);
- the proven critical bracket holds the critical tolerance (the q-th smallest ratio);
- a margin flagged exact equals the SVD's within the rounding of the two computations, one flagged as
  a bound is never above it;
- witnesses are dependent; fractions, rank histograms, grids and the exact Kruskal rank equal the
  enumeration.

Where a ratio lies within rounding of a tolerance (float64 cannot tell its side), that subset is not
held to either side. The default suite runs a few hundred examples (about half a minute); ``-m slow``
runs several thousand. Failing examples hypothesis found are kept below as plain regression tests.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import probes
from probes.fast.stages import RESOLVED
from probes.rank import resolve_rtol
from probes.robust import critical_rank

EPS64 = float(np.finfo(np.float64).eps)
SVD_ERROR = 16.0  # a float64 SVD's singular values are within SVD_ERROR (k + d) eps sigma_1 of the exact ones
REFINE_BELOW = 1e-5  # ratios below this get 50-digit singular values (float64's relative error is large)

settings.register_profile("probes-default", max_examples=60, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("probes-slow", max_examples=800, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DEFAULT = settings.get_profile("probes-default")
SLOW = settings.get_profile("probes-slow")

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "bool": torch.bool}


# ------------------------------------------------------------------ the pools


def _pow2_scale(rows: np.ndarray) -> np.ndarray:
    """rows times the power of two that brings their largest |entry| into [0.5, 1) (exact)."""
    top = float(np.abs(rows).max())
    return rows if top == 0 else np.ldexp(rows, -math.frexp(top)[1])


@dataclass
class Pool:
    x: torch.Tensor  # (N, d) as the probes get it
    kind: str
    rtol: float | None  # user tolerance, or None (the dtype's default)

    @property
    def x64(self) -> np.ndarray:
        return self.x.double().numpy()


@st.composite
def pools(draw, extreme: bool = True) -> Pool:
    """A small pool from one of the adversarial classes, in one of the dtypes."""
    kinds = ["gaussian", "planted", "near", "duplicated", "norms", "deficient", "clustered", "zeros"]
    kind = draw(st.sampled_from([*kinds, "extreme", "integer", "boolean"] if extreme else kinds))
    n_vec = draw(st.integers(2, 8))
    d = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((n_vec, d))
    dtype = draw(st.sampled_from(["float64", "float64", "float32", "float16", "bfloat16"]))
    if kind == "planted" and n_vec >= 3:
        size = draw(st.sampled_from([3, 4])) if n_vec >= 4 else 3
        rows = rng.choice(n_vec, size, replace=False)
        x[rows[-1]] = rng.standard_normal(size - 1) @ x[rows[:-1]]
    elif kind == "duplicated":
        i, j = rng.choice(n_vec, 2, replace=False)
        x[j] = x[i] * draw(st.sampled_from([1.0, -2.0, 2.0**-30, 1e-3, 1e3]))
    elif kind == "norms":
        x *= 10.0 ** rng.uniform(-8, 8, (n_vec, 1))
    elif kind == "extreme":
        dtype = "float64"
        count = draw(st.integers(1, n_vec))
        x[:count] *= 10.0 ** -draw(st.sampled_from([90.0, 120.0, 154.0, 160.0, 170.0, 200.0, 300.0, 315.0]))
        if draw(st.booleans()):
            x[-1] *= 1e300  # (and one vector near the top of float64's range)
        if draw(st.booleans()):
            x[0] = x[-1] * 2.0**-500  # parallel to a normal vector, far below it
    elif kind == "deficient":
        r = draw(st.integers(1, max(1, min(n_vec, d) - 1)))
        x = rng.standard_normal((n_vec, r)) @ rng.standard_normal((r, d))
    elif kind == "clustered":
        centres = rng.standard_normal((draw(st.integers(1, 3)), d))
        x = centres[rng.integers(0, centres.shape[0], n_vec)] + draw(
            st.sampled_from([1e-2, 1e-4, 1e-7])) * rng.standard_normal((n_vec, d))
    elif kind == "zeros":
        x[rng.choice(n_vec, draw(st.integers(1, n_vec)), replace=False)] = 0.0
        x[rng.random((n_vec, d)) < 0.2] = 0.0
    elif kind == "integer":
        dtype = "int64"
        x = np.round(3 * x)
    elif kind == "boolean":
        dtype = "bool"
        x = x > 0
    tensor = torch.from_numpy(np.asarray(x, dtype=np.float64)).to(DTYPES[dtype])
    if dtype in ("float16", "bfloat16") and not bool(torch.isfinite(tensor).all()):
        tensor = torch.from_numpy(np.asarray(x, dtype=np.float64)).clamp(-1e4, 1e4).to(DTYPES[dtype])
    rtol = None
    if kind == "near" and n_vec >= 2 and d >= 2:
        # a subset placed at 1.01x, 1.001x or 1 +- 1e-6 of the tolerance (a user rtol)
        k = draw(st.integers(2, min(n_vec, d)))
        ratio = Reference.svd_ratio(tensor.double().numpy()[:k])
        factor = draw(st.sampled_from([1.01, 1.001, 1 + 1e-6, 1 - 1e-6, 1 / 1.01]))
        if 0 < ratio / factor < 1:
            rtol = ratio / factor
    elif draw(st.booleans()):
        rtol = draw(st.sampled_from([1e-3, 1e-6, 1e-10, 1e-13, 0.3]))
    return Pool(tensor, kind, rtol)


# ------------------------------------------------------------------ the reference


class Reference:
    """Every k-subset of a pool, by SVD."""

    def __init__(self, x64: np.ndarray, k: int, subsets: list[tuple[int, ...]] | None = None):
        self.x64, self.k = x64, k
        self.d = x64.shape[1]
        every = subsets is None
        self.subsets = list(itertools.combinations(range(x64.shape[0]), k)) if every else subsets
        self.sv = [np.linalg.svd(_pow2_scale(x64[list(s)]), compute_uv=False) for s in self.subsets]
        self.ratio = np.array([self.refined_ratio(s, v) for s, v in zip(self.subsets, self.sv, strict=True)])
        self.band = SVD_ERROR * (k + self.d) * EPS64  # a float64 SVD ratio's error (absolute)

    @staticmethod
    def svd_ratio(rows: np.ndarray) -> float:
        sv = np.linalg.svd(_pow2_scale(rows), compute_uv=False)
        return 0.0 if sv[0] == 0 else float(sv[-1] / sv[0])

    def refined_ratio(self, subset: tuple[int, ...], sv: np.ndarray) -> float:
        """sigma_k / sigma_1 (0 for a zero matrix), by 50-digit arithmetic where float64 cannot resolve it."""
        if sv[0] == 0:
            return 0.0
        r = float(sv[-1] / sv[0])
        if r >= REFINE_BELOW:
            return r
        with mpmath.workdps(50):
            m = mpmath.matrix(_pow2_scale(self.x64[list(subset)]).tolist())
            s = mpmath.svd_r(m, compute_uv=False)
            values = sorted((abs(v) for v in s), reverse=True)
            return float(values[-1] / values[0]) if len(values) >= self.k else 0.0

    def ambiguous(self, t: float) -> np.ndarray:
        """Subsets whose side of tolerance t float64 cannot tell."""
        return np.abs(self.ratio - t) <= self.band + 1e-7 * t

    def full(self, t: float) -> np.ndarray:
        return self.ratio > t

    def critical(self, threshold: float) -> float:
        q = critical_rank(threshold, len(self.subsets))
        return float(np.sort(self.ratio)[q - 1])

    def margins(self, rtol: float) -> tuple[np.ndarray, np.ndarray]:
        """Per subset, the lowest and highest margin the float64 singular values allow within their
        rounding (and the eigenvalue route's resolution, RESOLVED)."""
        lo, hi = [], []
        for sv in self.sv:
            if sv[0] == 0:
                lo.append(math.inf)
                hi.append(math.inf)
                continue
            err = SVD_ERROR * (self.k + self.d) * EPS64 * sv[0] + 2 * RESOLVED * sv
            tol = rtol * sv[0]
            r = int((sv > tol).sum())
            if np.any(np.abs(sv - tol) <= err + 2 * RESOLVED * tol):  # (the rank itself is in doubt)
                lo.append(-math.inf)
                hi.append(max(abs(math.log10(max(v + e, 1e-300) / tol))
                              for v, e in zip(sv, err, strict=True)))
                continue

            def margin(kept: float, dropped: float, r: int = r, tol: float = tol, p: int = len(sv)) -> float:
                m_kept = math.log10(kept / tol) if r > 0 else math.inf
                m_drop = math.log10(tol / dropped) if r < p and dropped > 0 else math.inf
                return min(m_kept, m_drop)

            kept = sv[r - 1] if r > 0 else 0.0
            dropped = sv[r] if r < len(sv) else 0.0
            e_kept = err[r - 1] if r > 0 else 0.0
            e_drop = err[r] if r < len(sv) else 0.0
            lo.append(margin(kept - e_kept, dropped + e_drop))
            hi.append(margin(kept + e_kept, max(dropped - e_drop, 0.0)))
        return np.array(lo), np.array(hi)


def rtol_of(pool: Pool, k: int) -> float:
    return resolve_rtol(pool.rtol, k, pool.x.shape[1], pool.x.dtype)


# ------------------------------------------------------------------ the claims


def beyond_one_scale(x: torch.Tensor) -> bool:
    """Whether scaling the pool by one power of two (its largest entry into [0.5, 1), as needed where it
    exceeds 2^200) would lose a nonzero entry's bits: the input range the probes refuse."""
    a = x.double().abs()
    top = float(a.max())
    if x.dtype != torch.float64 or top == 0 or 2.0**-200 <= top <= 2.0**200:
        return False
    e = math.frexp(top)[1]
    return not bool((torch.ldexp(torch.ldexp(a, torch.tensor(-e)), torch.tensor(e)) == a).all())


def refused(pool: Pool, call) -> bool:
    """True where the pool is beyond one float64 scale and ``call`` refuses it with the library's error."""
    if not beyond_one_scale(pool.x):
        return False
    with pytest.raises(ValueError, match="float64 holds at most a ratio of 2\\^1021"):
        call()
    return True


def check_kruskal(pool: Pool, k: int, threshold: float, sampled: int | None = None) -> None:
    """One Kruskal test (through assumption1, whose threshold is free) against the enumeration: of every
    k-subset, or with ``sampled`` of that many sampled subsets (seed 7), the same the test draws."""
    n_vec, d = pool.x.shape
    rtol = rtol_of(pool, k)
    total = math.comb(n_vec, k)
    subsets = None
    if sampled is not None and sampled < total and k <= d:
        total = sampled
        subsets = [tuple(s) for s in probes.sample_subsets(n_vec, k, sampled, 7).tolist()]

    def run():
        seed = 0 if subsets is None else 7
        return probes.assumption1(pool.x, k, total, seed, pool.rtol, threshold=threshold)

    if k <= d and refused(pool, run):
        return
    res = run()
    if k > d:  # (no k vectors in R^d are independent: nothing is computed)
        assert res.fraction == 0.0 and res.witness is not None
        return
    ref = Reference(pool.x64, k, subsets)
    assert res.exhaustive == (subsets is None) or res.spectrum_proof
    unsure = ref.ambiguous(rtol)
    full = ref.full(rtol)
    # the fraction and the rank histogram equal the enumeration (subsets float64 cannot place aside)
    count = round(res.fraction * total)
    assert full[~unsure].sum() <= count <= full[~unsure].sum() + unsure.sum(), (res, ref.ratio)
    if not unsure.any():
        ranks = [int((sv > rtol * sv[0]).sum()) if sv[0] > 0 else 0 for sv in ref.sv]
        assert res.rank_counts == dict(sorted((r, ranks.count(r)) for r in set(ranks)))
    # a witness is dependent
    if res.witness is not None:
        w = ref.subsets.index(tuple(res.witness))
        assert not full[w] or unsure[w], (res.witness, ref.ratio[w], rtol)
    rob = res.robustness
    # the proven bracket holds the critical tolerance (with the rounding of the reference's ratio)
    truth = ref.critical(threshold)
    slack = ref.band if truth < REFINE_BELOW else 1e-7 * truth + ref.band
    assert rob.critical_rtol_low <= truth + slack and truth <= rob.critical_rtol_high * (1 + 1e-9) + slack, (
        res, truth, ref.ratio)
    if not math.isnan(rob.critical_rtol):
        assert rob.critical_rtol_low <= rob.critical_rtol <= rob.critical_rtol_high
    # the grid: the fraction at each multiplier equals the enumeration
    for m, fraction in (rob.rtol_grid or {}).items():
        t = m * rtol
        if t >= 1:
            assert fraction == 0.0
            continue
        sure = ~ref.ambiguous(t)
        got = round(fraction * total)
        assert ref.full(t)[sure].sum() <= got <= ref.full(t)[sure].sum() + (~sure).sum(), (m, res)
    check_margin(res.min_margin, rob.margin_bound, ref, rtol)


def check_margin(reported: float, bound: bool, ref: Reference, rtol: float) -> None:
    """An exact margin within the rounding of the SVD's; a bound never above it."""
    lo, hi = ref.margins(rtol)
    if math.isnan(reported):
        return
    top = float(hi.min())
    assert reported <= top + 1e-9, (reported, top, bound)
    if not bound:
        assert reported >= float(lo.min()) - 1e-9, (reported, float(lo.min()))


def kruskal_rank_bounds(pool: Pool) -> tuple[int, int]:
    """(lowest, highest) numerical Kruskal rank the enumeration allows (subsets float64 cannot place
    counted dependent, then full rank)."""
    n_vec, d = pool.x.shape
    low = high = None
    for k in range(1, min(n_vec, d) + 1):
        ref = Reference(pool.x64, k)
        rtol = rtol_of(pool, k)
        sure_full = ref.full(rtol) & ~ref.ambiguous(rtol)
        maybe_full = ref.full(rtol) | ref.ambiguous(rtol)
        if low is None and not sure_full.all():
            low = k - 1
        if high is None and not maybe_full.all():
            high = k - 1
        if high is not None and low is not None:
            break
    top = min(n_vec, d)
    return (top if low is None else low), (top if high is None else high)


def check_lower_bound(pool: Pool, proofs: bool) -> None:
    if refused(pool, lambda: probes.kruskal_lower_bound(pool.x)):
        assert refused(pool, lambda: probes.kruskal_rank_exact(pool.x))
        return
    low, high = kruskal_rank_bounds(pool)
    if proofs:  # the Gershgorin, whitened and null-space proofs, no search
        res = probes.kruskal_lower_bound(pool.x, rtol=pool.rtol, max_subsets=0, nullspace_seconds=0.2,
                                         nullspace_steps=10)
    else:
        res = probes.kruskal_lower_bound(pool.x, rtol=pool.rtol)
    assert res.lower <= high, (res, low, high, pool.kind)
    if res.exact:
        assert low <= res.lower, (res, low, high)
    if res.witness is not None:
        assert len(res.witness) == res.lower + 1
        ref = Reference(pool.x64, len(res.witness))
        t = rtol_of(pool, len(res.witness))
        w = ref.subsets.index(tuple(sorted(res.witness)))
        assert not ref.full(t)[w] or ref.ambiguous(t)[w]
    if low == high and not proofs:
        assert probes.kruskal_rank_exact(pool.x, pool.rtol) == low


# ------------------------------------------------------------------ the tests

THRESHOLDS = st.sampled_from([1.0, 1.0, 0.99, 0.9, 0.5])


def kruskal_case(pool: Pool, data) -> None:
    n_vec, d = pool.x.shape
    k = data.draw(st.integers(1, min(n_vec, d + 1)))
    sampled = data.draw(st.one_of(st.none(), st.integers(1, 40)))
    check_kruskal(pool, k, data.draw(THRESHOLDS), sampled)


@settings(DEFAULT, max_examples=150)
@given(pools(), st.data())
def test_kruskal_claims_equal_the_enumeration(pool, data):
    kruskal_case(pool, data)


@pytest.mark.slow
@settings(SLOW, max_examples=3000)
@given(pools(), st.data())
def test_kruskal_claims_equal_the_enumeration_many(pool, data):
    kruskal_case(pool, data)


@settings(DEFAULT, max_examples=80)
@given(pools(), st.booleans())
def test_the_lower_bound_never_exceeds_the_kruskal_rank(pool, proofs):
    check_lower_bound(pool, proofs)


@pytest.mark.slow
@settings(SLOW, max_examples=1500)
@given(pools(), st.booleans())
def test_the_lower_bound_never_exceeds_the_kruskal_rank_many(pool, proofs):
    check_lower_bound(pool, proofs)


@st.composite
def context_batches(draw) -> tuple[torch.Tensor, float | None]:
    """(B, n, d) contexts: Gaussian, some rank-deficient, zero, scaled or tiny; a tolerance."""
    b, n, d = draw(st.integers(1, 12)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    e = rng.standard_normal((b, n, d))
    for i in range(b):
        what = draw(st.sampled_from(["plain", "plain", "deficient", "zero", "scaled", "tiny", "near"]))
        if what == "deficient" and n >= 2:
            e[i, -1] = rng.standard_normal(n - 1) @ e[i, :-1]
        elif what == "zero":
            e[i] = 0.0
        elif what == "scaled":
            e[i] *= 10.0 ** rng.uniform(-8, 8, (n, 1))
        elif what == "tiny":
            e[i, rng.integers(0, n)] *= 10.0 ** -draw(st.sampled_from([90.0, 160.0, 300.0]))
        elif what == "near" and n >= 2:
            gap = 10.0 ** -draw(st.sampled_from([4.0, 7.0, 9.0, 12.0]))
            e[i, -1] = e[i, 0] + gap * rng.standard_normal(d)
    dtype = draw(st.sampled_from([torch.float64, torch.float32]))
    x = torch.from_numpy(e)
    if dtype == torch.float32:
        x = x.clamp(-1e30, 1e30).to(dtype)
    rtol = draw(st.sampled_from([None, None, 1e-3, 1e-9]))
    return x, rtol


def context_case(contexts: torch.Tensor, rtol: float | None, threshold: float) -> None:
    b, n, d = contexts.shape
    res = probes.assumption2(contexts, rtol, threshold=threshold)
    if n > d:
        assert res.fraction == 0.0
        return
    t = resolve_rtol(rtol, n, d, contexts.dtype)
    e64 = contexts.double().numpy()
    ref = Reference.__new__(Reference)  # one "subset" per context
    ref.x64, ref.k, ref.d = None, n, d
    ref.subsets = [(i,) for i in range(b)]
    ref.sv = [np.linalg.svd(_pow2_scale(e64[i]), compute_uv=False) for i in range(b)]
    ratios = []
    for i, sv in enumerate(ref.sv):
        if sv[0] == 0:
            ratios.append(0.0)
        elif sv[-1] / sv[0] >= REFINE_BELOW:
            ratios.append(float(sv[-1] / sv[0]))
        else:
            with mpmath.workdps(50):
                s = sorted((abs(v) for v in mpmath.svd_r(mpmath.matrix(_pow2_scale(e64[i]).tolist()),
                                                         compute_uv=False)), reverse=True)
                ratios.append(float(s[-1] / s[0]))
    ref.ratio = np.array(ratios)
    ref.band = SVD_ERROR * (n + d) * EPS64
    unsure, full = ref.ambiguous(t), ref.full(t)
    count = round(res.fraction * b)
    assert full[~unsure].sum() <= count <= full[~unsure].sum() + unsure.sum(), (res, ref.ratio)
    if res.witness is not None:
        assert not full[res.witness[0]] or unsure[res.witness[0]]
    rob = res.robustness
    truth = ref.critical(threshold)
    slack = ref.band if truth < REFINE_BELOW else 1e-7 * truth + ref.band
    assert rob.critical_rtol_low <= truth + slack and truth <= rob.critical_rtol_high * (1 + 1e-9) + slack, (
        res, truth, ref.ratio)
    check_margin(res.min_margin, rob.margin_bound, ref, t)


@settings(DEFAULT, max_examples=80)
@given(context_batches(), THRESHOLDS)
def test_assumption2_claims_equal_the_enumeration(case, threshold):
    context_case(*case, threshold)


@pytest.mark.slow
@settings(SLOW, max_examples=1500)
@given(context_batches(), THRESHOLDS)
def test_assumption2_claims_equal_the_enumeration_many(case, threshold):
    context_case(*case, threshold)


# ------------------------------------------------------------------ regressions (the audit's, hypothesis's)


def test_regression_parallel_pair_far_below_the_largest_vector():
    """Issue 40, class 1: two exactly parallel vectors, one 1e-170 times the other, beside a third."""
    x = torch.tensor([[1.0, 0.3], [0.2, 1.0], [1e-170, 0.3e-170]], dtype=torch.float64)
    check_lower_bound(Pool(x, "extreme", None), proofs=False)
    check_lower_bound(Pool(x, "extreme", None), proofs=True)
    for k in (1, 2):
        check_kruskal(Pool(x, "extreme", None), k, 1.0)


def test_regression_a_range_beyond_one_float64_scale_is_refused():
    """Found by hypothesis: 1.3e-91 beside -1.3e299 (a ratio of 1e390): one scale for the pool loses the
    small vector (it was called rank 0); refused with the library's error, by every entry point."""
    x = torch.tensor([[1.2573e-91], [-1.3210e299]], dtype=torch.float64)
    pool = Pool(x, "extreme", None)
    for call in (lambda: probes.kruskal_test(x, 1), lambda: probes.kruskal_rank_exact(x),
                 lambda: probes.kruskal_lower_bound(x), lambda: probes.numerical_rank(x),
                 lambda: probes.assumption2(x[None])):
        assert refused(pool, call)
    check_kruskal(pool, 1, 1.0)


def test_regression_a_zero_vector_has_critical_tolerance_zero():
    """Issue 40, class 2: a zero vector fails at every tolerance (k = 1)."""
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[2] = 0
    check_kruskal(Pool(x, "zeros", None), 1, 1.0)


def test_regression_a_dependent_pair_below_the_gram_resolution():
    """Issue 40, class 3: sigma_2 / sigma_1 = 5e-9, below what float64 Gram eigenvalues resolve."""
    x = torch.tensor([[1.0, 0.0], [1.0, 1e-8], [0.3, 1.0]], dtype=torch.float32)
    check_kruskal(Pool(x, "near", None), 2, 1.0)
    res = probes.kruskal_test(x, 2, robustness=False)
    check_margin(res.min_margin, res.robustness.margin_bound, Reference(x.double().numpy(), 2),
                 rtol_of(Pool(x, "near", None), 2))
