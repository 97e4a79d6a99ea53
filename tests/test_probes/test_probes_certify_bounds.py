"""Whitened coherence / Babel bounds and the null-space bound (probes.spark) against brute force:
never above the numerical Kruskal rank, equal to it where the bound can reach it."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import brute_kruskal_rank

import probes.spark as spark
from probes.bounds import METHODS, kruskal_lower_bound
from probes.kruskal import check_witness
from probes.rank import numerical_rank, resolve_rtol
from probes.spark import (
    _caps,
    _evaluate,
    _largest_k,
    _subset_bound,
    _taus,
    _tolerances,
    clip_grid,
    nullspace_bound,
    spectrum,
    whiten,
    whitened_bound,
)

EPS64 = float(np.finfo(np.float64).eps)


def token_like(seed: int, n_vec: int, d: int, mean: float = 30.0, dtype=torch.float64) -> torch.Tensor:
    """Vectors sharing one dominant direction, as trained tokens do (raw coherence near 1)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -2, d, dtype=torch.float64)  # an anisotropic spread around the mean
    x = mean * torch.randn(1, d, generator=g, dtype=torch.float64) + torch.randn(n_vec, d, generator=g,
                                                                                 dtype=torch.float64) * scales
    return x.to(dtype)


def small_sets(seed: int):
    """Small sets of every kind a bound must not overstate (seeded)."""
    g = torch.Generator().manual_seed(seed)
    n_vec, d = 5 + seed % 4, 3 + seed % 4
    x = torch.randn(n_vec, d, generator=g, dtype=torch.float64)
    near = x.clone()
    near[-1] = x[0] - 0.5 * x[1] + 1e-9 * torch.randn(d, generator=g, dtype=torch.float64)
    dup = torch.cat([x, x[1:2]])
    wide = token_like(seed, n_vec, 2 * n_vec)  # N < d: whitening can prove N
    tall = token_like(seed, 2 * d + 1, d)  # N > d
    return [("generic", x), ("generic-float32", x.float()), ("near-dependent", near), ("duplicate", dup),
            ("token-like-wide", wide), ("token-like-tall", tall), ("token-like-float32", wide.float())]


@pytest.mark.parametrize("seed", range(8))
def test_every_new_bound_stays_below_the_brute_force_kruskal_rank(seed):
    for name, x in small_sets(seed):
        truth = brute_kruskal_rank(x)
        res = kruskal_lower_bound(x, max_subsets=0)
        assert res.lower <= truth, (name, res)
        assert max(res.whitened_coherence_k, res.whitened_babel_k, res.nullspace_k) <= max(truth, 1), (
            name,
            res,
        )
        assert res.method in METHODS
        if res.exact:
            assert res.lower == truth, (name, res)
        # each bound on its own, forced to run from k = 1 (in kruskal_lower_bound they may be skipped)
        if truth >= 1 and min(x.shape) >= 2:
            top = min(x.shape)
            rtols = [resolve_rtol(None, k, x.shape[1], x.dtype) for k in range(1, top + 1)]
            sp = spectrum(x.double(), rtols)
            white = whitened_bound(sp, start=1)
            assert max(white.coherence_k, white.babel_k) <= truth, (name, white)
            for clip in {0, top - 1}:
                null = nullspace_bound(sp, whiten(sp, clip), start=1, seconds=60.0)
                assert null.k <= max(truth, 1), (name, clip, null)


@pytest.mark.parametrize("seed", range(4))
def test_whitening_reaches_the_kruskal_rank_of_token_like_vectors(seed):
    """Raw cosines near 1 prove only 2; after whitening the bound is the exact Kruskal rank N (N < d)."""
    x = token_like(seed, 9, 16)
    truth = brute_kruskal_rank(x)
    res = kruskal_lower_bound(x, max_subsets=0)
    assert res.coherence > 0.99 and max(res.coherence_k, res.babel_k) <= 2
    assert truth == 9 and (res.lower, res.exact) == (9, True), res
    assert res.method in ("whitened-coherence", "whitened-babel")


@pytest.mark.parametrize("factor", [1 - 1e-6, 1 + 1e-6])
def test_whole_set_at_the_tolerance(factor):
    """N < d vectors whose sigma_N / sigma_1 sits just below or just above rtol: the full whitening proves
    N exactly when the set is independent at rtol, and stays below N when it is not."""
    rtol, n_vec, d = 1e-3, 6, 10
    g = torch.Generator().manual_seed(5)
    u = torch.linalg.qr(torch.randn(n_vec, n_vec, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(d, n_vec, generator=g, dtype=torch.float64))[0]
    s = torch.tensor([1.0, 0.5, 0.2, 0.05, 0.01, rtol * factor], dtype=torch.float64)
    x = u @ torch.diag(s) @ v.T  # (N, d) with sigma_N / sigma_1 = rtol * factor
    truth = brute_kruskal_rank(x, rtol)
    res = kruskal_lower_bound(x, rtol=rtol, max_subsets=0)
    assert res.lower <= truth
    if factor > 1:
        assert truth == n_vec and (res.lower, res.exact) == (n_vec, True), res
    else:
        assert truth < n_vec and res.lower < n_vec


@pytest.mark.parametrize("seed", range(3))
def test_pair_dependent_at_rtol_is_never_certified(seed):
    """Two vectors at an angle whose sigma_2 / sigma_1 = tan(angle / 2) is just below rtol, hidden among
    token-like vectors: no bound may prove 2."""
    rtol = 1e-4
    x = token_like(seed, 7, 12)
    angle = 2 * math.atan(rtol * (1 - 1e-3))
    b = x[1] - (x[1] @ x[0]) / (x[0] @ x[0]) * x[0]
    x[2] = math.cos(angle) * x[0] + math.sin(angle) * b / b.norm() * x[0].norm()
    truth = brute_kruskal_rank(x, rtol)
    assert truth == 1
    res = kruskal_lower_bound(x, rtol=rtol, max_subsets=0)
    assert res.lower == 1 and res.witness is not None and check_witness(x, res.witness, rtol=rtol)


def test_nullspace_bound_beats_the_gershgorin_bounds_where_the_null_space_is_small():
    """12 generic vectors in R^10 (Kruskal rank 10, brute force): cosines up to ~0.8 stop every
    Gershgorin bound at 3 or below; the null-space bound (two null directions) proves 6 (4 before the
    sum of the k largest terms and the rank-aware clip grid)."""
    x = torch.randn(12, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    truth = brute_kruskal_rank(x)
    assert truth == 10
    plain = kruskal_lower_bound(x, max_subsets=0, nullspace_steps=0)
    assert max(plain.coherence_k, plain.babel_k, plain.whitened_coherence_k, plain.whitened_babel_k) <= 3
    assert (plain.lower, plain.method, plain.nullspace_k, plain.exact) == (6, "nullspace", 6, False), plain
    assert plain.nullspace_programs <= 12 and "null-space bound 6" in plain.note
    res = kruskal_lower_bound(x, max_subsets=0)
    assert res.nullspace_k >= plain.nullspace_k and res.lower <= truth, res


def test_the_sum_of_the_k_largest_terms_certifies_more_than_k_times_the_largest():
    """Known answers of the counting step (rho = 1, the same tolerance t for every k): terms 0.3, 0.1 x 9
    at t = 0: k times the largest passes only k = 3 (0.9 < 1), the sum of the k largest passes k = 7
    (0.3 + 0.6 < 1 <= 0.3 + 0.7). At t = 0.02 the caps are kappa = 0.02 (0.02 + sqrt(0.02^2 + 4 a)) / 2:
    0.011156 for a = 0.3 and 0.006528 for a = 0.1; the subsets led by the 0.3 vector sum to
    0.311156 + (k - 1) 0.111156, below 1 up to k = 7 (with lambda <= t alone: 0.32 + 6 x 0.12 > 1, 6)."""
    ones, rho = torch.ones(10, dtype=torch.float64), torch.ones(10, dtype=torch.float64)
    a = torch.tensor([0.3] + [0.1] * 9, dtype=torch.float64)
    t = torch.zeros(10, dtype=torch.float64)
    assert _largest_k(a, t[:, None] * ones, rho) == 7
    assert _largest_k(a, (t + 0.02)[:, None] * ones, rho) == 7
    assert _largest_k(torch.full((10,), 0.6, dtype=torch.float64), 0 * t[:, None] * ones, rho) == 1


def test_the_spread_of_a_null_vector_shrinks_the_tolerance_term():
    """Known answer of (ii): 20 vectors with a = 0.05, b = 1 at tau = 0.1. A null vector's entries are at
    most a + b lambda of its l1 norm, so lambda <= Lambda = 0.1 (0.1 + sqrt(0.01 + 0.2)) / 2 = 0.0279129
    and each term is 0.0779129: k = 12 passes (0.935), 13 does not (1.013). With lambda <= tau alone the
    terms are 0.15 and k = 6. Where a + tau b >= 1 the cap is tau itself."""
    n = 20
    a, b = torch.full((n,), 0.05, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
    tau = torch.full((n,), 0.1, dtype=torch.float64)
    # closed form, float64 rounding
    assert float(_caps(a, b, tau)[0]) == pytest.approx(0.1 * (0.1 + math.sqrt(0.21)) / 2, rel=1e-12)
    assert _largest_k(a, tau[:, None] * b, torch.ones(n, dtype=torch.float64)) == 12  # t_k = 0.1, rho = 1
    far = _caps(torch.tensor([0.9], dtype=torch.float64), torch.ones(1, dtype=torch.float64),
                torch.tensor([0.5], dtype=torch.float64))
    assert float(far[0]) == 0.5


@pytest.mark.parametrize("leaders", [1, 3, 32])
@pytest.mark.parametrize("seed", range(4))
def test_subset_bound_is_never_below_the_largest_subset_sum(monkeypatch, seed, leaders):
    """_subset_bound against every k-subset of 9 random terms: never below the largest
    sum_{j in S} (a_j + max_{i in S} kappa_i b_j), and equal to it when every vector is a leader."""
    monkeypatch.setattr(spark, "SPREAD_LEADERS", leaders)
    g = torch.Generator().manual_seed(seed)
    n = 9
    a, b, kappa = (torch.rand(n, generator=g, dtype=torch.float64) for _ in range(3))
    kappa[:3] = kappa[0]  # ties
    for k in range(2, n + 1):
        truth = max(float((a[list(s)] + kappa[list(s)].max() * b[list(s)]).sum())
                    for s in itertools.combinations(range(n), k))
        bound = _subset_bound(a, b, kappa, k)
        assert bound >= truth * (1 - 1e-12), (k, bound, truth)
        if leaders >= n:
            assert bound == pytest.approx(truth, rel=1e-12)  # <= 9 float64 terms summed in another order


@pytest.mark.parametrize("seed", range(3))
def test_tokens_in_a_hyperplane_whiten_in_their_numerical_rank(seed):
    """Rows centred to sum zero (as after a LayerNorm): the pool has rank d - 1, its last singular value
    ~1e-16 sigma_1. The clip grid starts at the numerical rank, and every bound, refinement included,
    stays at or below the brute-force Kruskal rank."""
    x = token_like(seed, 13, 6)
    x = x - x.mean(dim=1, keepdim=True)
    truth = brute_kruskal_rank(x)
    rtols = [resolve_rtol(None, k, 6, x.dtype) for k in range(1, 7)]
    sp = spectrum(x, rtols)
    assert clip_grid(sp)[0] == 4  # c = r - 1 with r = 5 = d - 1
    res = kruskal_lower_bound(x, max_subsets=0)
    assert res.lower <= truth <= 5, res
    for clip in clip_grid(sp):
        assert nullspace_bound(sp, whiten(sp, clip), start=1, seconds=5.0).k <= max(truth, 1)


def test_refinement_raises_the_null_space_bound_of_a_tall_token_like_set():
    """80 token-like vectors in R^32 (N > d, raw coherence ~1): the refined certificates prove more than
    the local ones, and never more than the Kruskal rank can be (d)."""
    x = token_like(3, 80, 32)
    local = kruskal_lower_bound(x, max_subsets=0, nullspace_steps=0, nullspace_seconds=0.5)
    refined = kruskal_lower_bound(x, max_subsets=0, nullspace_seconds=0.5)
    assert max(local.coherence_k, local.babel_k) <= 2
    assert refined.nullspace_k > local.nullspace_k >= 1 and refined.lower <= 32, (local, refined)


def test_nullspace_bound_on_a_frame_of_known_coherence():
    """Unit-norm vectors with mu = 1/4 (spikes and a normalised Hadamard basis in R^16): the coherence
    bounds stop at 4 (mu_1(4) = 1), the null-space certificates are checked to stay at or below the
    Kruskal rank 7 and never below what coherence proves."""
    from scipy.linalg import hadamard

    frame = torch.cat(
        [torch.eye(16, dtype=torch.float64), torch.tensor(hadamard(16), dtype=torch.float64) / 4]
    )
    rtols = [resolve_rtol(None, k, 16, torch.float64) for k in range(1, 17)]
    sp = spectrum(frame, rtols)
    null = nullspace_bound(sp, whiten(sp, 15), start=1, seconds=60.0)
    assert null.complete and 4 <= null.k <= 7, null


def test_nullspace_cap_and_bad_input():
    x = token_like(0, 60, 12)
    res = kruskal_lower_bound(x, max_subsets=0, nullspace_seconds=0, nullspace_steps=0)
    assert (res.nullspace_k, res.nullspace_programs) == (1, 0)
    rtols = [resolve_rtol(None, k, 12, x.dtype) for k in range(1, 13)]
    sp = spectrum(x, rtols)
    capped = nullspace_bound(sp, whiten(sp, 11), start=1, seconds=0.0)  # solver-free certificates only
    assert capped.solved == 0 and capped.complete and capped.k <= brute_kruskal_rank(x[:14])
    for bad in (-1, math.inf, True, "5"):
        with pytest.raises(ValueError, match="nullspace_seconds must be a finite number >= 0"):
            kruskal_lower_bound(x, nullspace_seconds=bad)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="nullspace_steps must be"):
            kruskal_lower_bound(x, nullspace_steps=bad)


def test_without_whitening_the_old_bounds_are_unchanged():
    x = token_like(1, 40, 24)
    old = kruskal_lower_bound(x, max_subsets=0, whiten=False)
    new = kruskal_lower_bound(x, max_subsets=0)
    assert (old.coherence_k, old.babel_k, old.coherence) == (new.coherence_k, new.babel_k, new.coherence)
    assert (old.whitened_babel_k, old.nullspace_k) == (1, 1) and new.lower >= old.lower
    row = new.to_dict()
    assert isinstance(row["whitened_babel_k"], int) and isinstance(row["nullspace_programs"], int)


def planted(seed: int, n_vec: int, d: int, size: int, rtol: float, factor: float) -> torch.Tensor:
    """Token-like vectors whose first ``size`` rows have sigma_size / sigma_1 = rtol * factor exactly."""
    x = token_like(seed, n_vec, d)
    u, s, vh = torch.linalg.svd(x[:size], full_matrices=False)
    s[-1] = rtol * factor * s[0]
    x[:size] = u @ torch.diag(s) @ vh  # (size, d)
    return x


@pytest.mark.parametrize("seed", range(4))
def test_a_dependent_subset_obeys_both_inequalities_of_the_proof(seed):
    """A 3-subset dependent just below rtol (sigma_3 / sigma_1 = 0.999 rtol) among 14 token-like vectors in
    R^6: for every whitening, its null vector c gives w = D c with ||Z^T w|| <= ||A|| r_3 + e_3 and
    |u_j^T Z^T w| <= ||A u_j|| r_3 + ||u_j|| e_3 for every certificate, 1 / ||w||_1 is at most the largest
    cap in the subset, and the terms of the subset sum to at least 1, so the bound never certifies 3."""
    rtol, size = 1e-3, 3
    x = planted(seed, 14, 6, size, rtol, 1 - 1e-3)
    assert int(numerical_rank(x[:size], rtol).rank) == size - 1
    rtols = [rtol] * 6
    sp = spectrum(x, rtols)
    c = torch.linalg.svd(x[:size])[0][:, -1]  # (size,): the left singular vector of sigma_3
    for clip in clip_grid(sp):
        w = whiten(sp, clip)
        r, e = _tolerances(sp, w)
        order = (w.unit @ w.unit.T).fill_diagonal_(0).abs().argsort(dim=1, descending=True)
        u = spark._local_certificates(w.unit, order, 2)
        a, b = _evaluate(w.unit, u)
        b2 = spark._map_norms(u, w, sp.v_norm)
        coef = b2 * r[size - 1] + b * e[size - 1]  # (N,): |u_j^T Z^T w| <= coef_j for this subset's w
        wv = w.rho[:size] * c  # (size,)
        zw = w.unit[:size].T @ wv  # (p,): Z^T w
        assert float(torch.linalg.vector_norm(zw)) <= float(w.a_norm * r[size - 1] + e[size - 1]) * (1 + 1e-9)
        assert bool(((u @ zw).abs() <= coef * (1 + 1e-9)).all())
        lam = 1 / float(wv.abs().sum())
        kappa = _caps(a, coef, _taus(torch.tensor(1.0, dtype=torch.float64), w.rho))
        assert lam <= float(kappa[:size].max()) * (1 + 1e-9), (clip, lam, kappa[:size])
        assert float((a[:size] + kappa[:size].max() * coef[:size]).sum()) >= 1 - 1e-9
        assert _largest_k(a, r[:, None] * b2 + e[:, None] * b, w.rho) < size
        assert nullspace_bound(sp, w, start=1, seconds=5.0).k < size


@pytest.mark.parametrize("rtol", [1e-3, 1e-2, 0.1])
@pytest.mark.parametrize("seed", range(5))
def test_bounds_at_a_loose_tolerance_stay_below_the_brute_force_rank(seed, rtol):
    """Where the tolerance, not the geometry, decides (rtol up to 0.1, a subset planted at 0.99 rtol):
    every clip of the null-space bound, linear programs included, and the whole bound stay at or below
    the brute-force numerical Kruskal rank."""
    sets = [planted(seed, 11, 6, 2 + seed % 4, rtol, 0.99), token_like(seed, 11, 6),
            torch.randn(10, 5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)]
    for x in sets:
        truth = brute_kruskal_rank(x, rtol)
        assert kruskal_lower_bound(x, rtol=rtol, max_subsets=0).lower <= truth
        if truth >= 1:
            sp = spectrum(x, [rtol] * min(x.shape))
            for clip in sorted({0, *clip_grid(sp)}):
                null = nullspace_bound(sp, whiten(sp, clip), start=1, seconds=5.0)
                assert null.k <= max(truth, 1), (clip, null, truth)


@pytest.mark.parametrize("seed", range(4))
def test_the_denominators_bound_sigma_1_of_every_subset(seed):
    """den_k >= sigma_1(X_S) for every k-subset S (brute force), on generic, token-like and
    low-rank-plus-noise sets."""
    g = torch.Generator().manual_seed(seed)
    low = torch.randn(10, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 6, generator=g,
                                                                            dtype=torch.float64)
    for x in (torch.randn(10, 6, generator=g, dtype=torch.float64), token_like(seed, 10, 6),
              low + 1e-3 * torch.randn(10, 6, generator=g, dtype=torch.float64)):
        sp = spectrum(x, [1e-6] * 6)
        for k in range(1, 7):
            worst = max(float(torch.linalg.matrix_norm(x[list(s)], ord=2))
                        for s in itertools.combinations(range(10), k))
            assert worst <= float(sp.den[k - 1]), (k, worst, sp.den[k - 1])


def test_the_weighted_spread_limits_lambda_where_one_vector_is_short():
    """(iii) on 20 vectors with a = 0.05, b = 1 at t = 0.1, one of them with rho = 0.25 (tau 0.4, 4x the
    others): a null vector puts at most a + b lambda of its l1 norm on the short vector, so lambda is
    bounded by the weighted fill H(lambda) = m (1 + 15 m), m = 0.05 + lambda (largest lambda: 0.05, where
    0.05^2 = 0.01 x 0.1 x 2.5), not by that vector's own cap (0.2). _spread_limit is at or above that
    largest lambda (dense search of a direct H) and within one grid cell of it; with it the subsets that
    hold the short vector sum to ~k x 0.1, and the bound proves 9 where the caps alone (terms 0.25)
    prove 3."""
    n = 20
    a, b = torch.full((n,), 0.05, dtype=torch.float64), torch.ones(n, dtype=torch.float64)
    rho = torch.ones(n, dtype=torch.float64)
    rho[0] = 0.25
    lam = torch.linspace(1e-6, 0.4, 400001, dtype=torch.float64)
    m = 0.05 + lam
    feasible = lam**2 <= 0.01 * m * (1 + 15 * m)
    sup = float(lam[feasible].max())
    limit = spark._spread_limit(a, b, 0.1, rho)
    assert sup == pytest.approx(0.05, abs=1e-5) and sup <= limit <= sup + 0.4 / 16, (sup, limit)
    t = torch.full((n,), 0.1, dtype=torch.float64)
    assert _largest_k(a, t[:, None] * b, rho) == 9
    kappa = _caps(a, t[0] * b, _taus(torch.tensor(1.0, dtype=torch.float64), rho))
    caps_only = max(k for k in range(1, n + 1) if k == 1 or all(
        _subset_bound(a, t[0] * b, kappa, j) < 1 for j in range(2, k + 1)))
    assert caps_only == 3
