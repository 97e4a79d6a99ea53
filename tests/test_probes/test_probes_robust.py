"""Tolerance robustness of verdicts (probes.robust): exact smallest margin, critical tolerance and its
bracket, the tolerance grid, all against a plain NumPy float64 SVD of the same subsets."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import with_singular_values

import probes

F64 = np.finfo(np.float64).eps


def test_grid_order_takes_the_extremes_first_then_bisects():
    order = probes.robust._grid_order((0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0))
    assert order == [0.1, 10.0, 0.3, 0.2, 0.5, 3.0, 2.0, 5.0]
    assert probes.robust._grid_order((0.25, 4.0)) == [0.25, 4.0]


def ratios(x: torch.Tensor, subsets: torch.Tensor) -> np.ndarray:
    """sigma_k / sigma_1 of every subset by NumPy's float64 SVD: (S,)."""
    sv = np.linalg.svd(x.double().numpy()[subsets.numpy()], compute_uv=False)  # (S, k)
    return sv[:, -1] / sv[:, 0]


def spread_pool(n: int, d: int, seed: int) -> torch.Tensor:
    """Vectors whose k-subsets have sigma_k / sigma_1 spread over decades: random directions with
    column scales falling over four decades."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * torch.logspace(0, -4, d, dtype=torch.float64)


def ratio_tol(k: int, d: int) -> float:
    """How far the ratio of the fast path may sit from NumPy's: the float64 error of a singular value
    relative to sigma_1 (backward stability, with room)."""
    return 64 * max(k, d) * F64


def test_exact_min_margin_of_constructed_contexts_equals_the_svd_margin():
    contexts = torch.stack([with_singular_values([1.0, 0.5, f], 3, 7, seed=i)
                            for i, f in enumerate([0.3, 0.01, 2e-3, 0.2, 0.05])])  # (5, 3, 7)
    rtol = 1e-4
    res = probes.assumption2(contexts, rtol=rtol)
    assert res.robustness.margin_bound is False
    expected = math.log10(2e-3 / rtol)  # the smallest sigma_3 / sigma_1 sets it
    assert res.min_margin == pytest.approx(expected, abs=ratio_tol(3, 7) / 2e-3)
    sv = np.linalg.svd(contexts.numpy(), compute_uv=False)
    assert (
        res.robustness.critical_rtol_low <= (sv[:, -1] / sv[:, 0]).min() <= res.robustness.critical_rtol_high
    )
    assert res.robustness.critical_rtol == pytest.approx(2e-3, rel=ratio_tol(3, 7) / 2e-3)  # as min_margin
    assert res.robustness.verdict_margin == pytest.approx(expected, abs=ratio_tol(3, 7) / 2e-3)


def test_exact_min_margin_of_a_kruskal_test_equals_the_svd_margin():
    x = spread_pool(40, 10, seed=1)
    res = probes.kruskal_test(x, 6, subsets=400, seed=3)
    r = ratios(x, probes.sample_subsets(40, 6, 400, 3))
    assert res.fraction == 1.0 and res.robustness.margin_bound is False
    assert res.min_margin == pytest.approx(math.log10(r.min() / res.rtol), abs=ratio_tol(6, 10) / r.min())
    # verdict "every subset full rank": the critical tolerance is the smallest ratio
    assert res.robustness.critical_rtol_low <= r.min() * (
        1 + 1e-9
    ) and r.min() <= res.robustness.critical_rtol_high * (1 + 1e-9)


@pytest.mark.parametrize("threshold", [0.99, 0.9, 0.5])
def test_critical_bracket_contains_the_svd_quantile(threshold):
    x = spread_pool(50, 12, seed=2)
    k, count, seed = 12, 600, 5
    r = np.sort(ratios(x, probes.sample_subsets(50, k, count, seed)))[::-1]  # descending
    rtol = float(np.quantile(r, 0.3))  # the verdict at 0.99 and 0.9 fails, at 0.5 holds
    res = probes.assumption1(x, k, subsets=count, seed=seed, rtol=rtol, threshold=threshold)
    need = math.ceil(threshold * count)
    truth = r[need - 1]  # the verdict holds below the need-th largest ratio and fails at it
    slack = ratio_tol(k, 12)
    assert res.robustness.critical_rtol_low - slack <= truth <= res.robustness.critical_rtol_high + slack
    assert (
        res.robustness.critical_rtol_high <= res.robustness.critical_rtol_low * 1.03 + slack
    )  # closed on this small test
    assert res.share_meets_threshold == (rtol < res.robustness.critical_rtol)
    assert res.robustness.verdict_margin == pytest.approx(
        abs(math.log10(res.robustness.critical_rtol / rtol))
    )


@pytest.mark.parametrize("chunks", ["one", "many", "large-k"])
def test_grid_fractions_equal_numpy_matrix_rank_at_every_grid_tolerance(chunks, monkeypatch):
    """Also with the grid decided in many small chunks on two worker threads (``many``), and by the
    routes taken for large k (``large-k``: factorisations above rtol instead of eigenvalues, stage 1b
    ceilings)."""
    if chunks == "large-k":
        monkeypatch.setattr(probes.fast.tuning, "TUNING",
                            dataclasses.replace(probes.fast.tuning.TUNING, eigen_max_k=0, ceil_1b_k=1))
    if chunks == "many":
        monkeypatch.setattr(probes.fast.tuning, "TUNING",
                            dataclasses.replace(probes.fast.tuning.TUNING, cache_bytes=8 * 10 * 10 * 7))
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
    x = spread_pool(60, 10, seed=4)
    k, count, seed = 10, 500, 7
    subsets = probes.sample_subsets(60, k, count, seed)
    r = ratios(x, subsets)
    rtol = float(np.quantile(r, 0.5))  # ratios on both sides of every grid point
    try:
        res = probes.kruskal_test(x, k, subsets=count, seed=seed, rtol=rtol)
    finally:
        if chunks == "many":
            torch.set_num_threads(threads)
    assert set(res.robustness.rtol_grid) == set(probes.robust.DEFAULT_RTOL_GRID)
    mats = x.numpy()[subsets.numpy()]
    for m, fraction in res.robustness.rtol_grid.items():
        ranks = np.linalg.matrix_rank(mats, rtol=m * rtol)  # NumPy: sigma > rtol * sigma_max
        assert fraction == np.mean(ranks == k), m
    assert (
        1 > res.robustness.rtol_grid[0.1] > res.robustness.rtol_grid[1.0] > res.robustness.rtol_grid[5.0] > 0
    )  # spread across the grid


def test_grid_is_optional_and_custom():
    x = spread_pool(30, 8, seed=5)
    assert probes.kruskal_test(x, 8, subsets=50, rtol_grid=None).robustness.rtol_grid is None
    res = probes.kruskal_test(x, 8, subsets=50, rtol_grid=[4, 0.25])
    assert list(res.robustness.rtol_grid) == [0.25, 4.0]
    with pytest.raises(ValueError, match="rtol_grid"):
        probes.kruskal_test(x, 8, subsets=50, rtol_grid=[0, 1])
    with pytest.raises(ValueError, match="robustness"):
        probes.kruskal_test(x, 8, subsets=50, robustness="yes")


def test_spectra_after_eigenvalue_brackets_add_only_the_svd_and_are_charged_once(monkeypatch):
    """The exact ratios of matrices whose eigenvalues were computed before (a bracket only, where the
    band is wide) come from the SVD alone; the spectra budget counts each matrix once; the ratios equal
    NumPy's SVD."""
    sv = [[1.0, 0.5, f] for f in (0.3, 1e-9, 2e-3, 1e-10)]  # two below the Gram route's resolution
    mats = torch.stack([with_singular_values(s, 3, 7, seed=i) for i, s in enumerate(sv)])  # (4, 3, 7)
    src = probes.robust.context_matrices(mats)
    ref = probes.robust._Refiner(src, probes.fast.matrix_decisions(mats, 1e-4), 1e-4)
    calls = []
    spectra = probes.robust._Refiner._spectra
    monkeypatch.setattr(probes.robust._Refiner, "_spectra",
                        lambda self, part, svd=True: calls.append(part.tolist()) or spectra(self, part, svd))
    pos = torch.arange(4)
    ref.exact(pos, svd=False)
    assert sorted(sum(calls, [])) == [0, 1, 2, 3] and ref.spectra == 4
    loose = ref.ratio.isnan()
    assert loose.tolist() == [False, True, False, True]  # (the bracket alone cannot give those two)
    calls.clear()
    ref.exact(pos)
    assert calls == [] and ref.spectra == 4 and not bool(ref.ratio.isnan().any())
    truth = np.linalg.svd(mats.numpy(), compute_uv=False)
    assert np.allclose(ref.ratio.numpy(), truth[:, -1] / truth[:, 0], rtol=0, atol=ratio_tol(3, 7))
    tol = ratio_tol(3, 7)  # (the SVD's own rounding, beside the proven ends)
    assert bool((ref.lo <= ref.ratio + tol).all() and (ref.ratio <= ref.hi + tol).all())


@pytest.mark.parametrize("threshold", [0.9, 0.3])
def test_tolerance_fields_without_a_grid_start_from_the_tests_ceilings(threshold, monkeypatch):
    """With ``rtol_grid=None`` the tolerance fields still follow the test: it must give the dependent
    subsets their ceilings and aim at the critical tolerance as with a grid (without them the bracket
    was narrowed by new factorisations: about 2x the plain test at the BERT-large-like cluster pool),
    and the bracket must still hold the float64 SVD's quantile."""
    g = torch.Generator().manual_seed(4)
    x = spread_pool(40, 10, seed=6)
    x[:20] = torch.randn(20, 4, generator=g, dtype=torch.float64) @ x[20:24]  # a rank-4 cluster
    k, count, seed = 6, 400, 2
    seen = []
    real = probes.fast.subset_decisions

    def spy(*args, **kwargs):
        seen.append((kwargs.get("ceilings", False), kwargs.get("aim")))
        return real(*args, **kwargs)

    monkeypatch.setattr(probes.fast, "subset_decisions", spy)
    res = probes.assumption1(x, k, subsets=count, seed=seed, threshold=threshold, rtol_grid=None)
    assert seen and all(ceil and aim is not None for ceil, aim in seen)
    assert res.robustness.rtol_grid is None
    r = np.sort(ratios(x, probes.sample_subsets(40, k, count, seed)))[::-1]  # descending
    assert 0.2 < (r > res.rtol).mean() < 0.95  # dependent and full-rank subsets both
    truth = r[math.ceil(threshold * count) - 1]
    slack = ratio_tol(k, 10)
    assert res.robustness.critical_rtol_low - slack <= truth <= res.robustness.critical_rtol_high + slack
    rob = res.robustness
    if math.isnan(rob.critical_rtol):  # (only the bracket is known: the verdict holds below it, fails above)
        assert rob.exact(res.rtol) is False
        meets = res.share_meets_threshold
        assert (res.rtol < rob.critical_rtol_low) <= meets <= (res.rtol < rob.critical_rtol_high)
    else:
        assert res.share_meets_threshold == (res.rtol < rob.critical_rtol)
    seen.clear()
    probes.assumption1(x, k, subsets=count, seed=seed, threshold=threshold, robustness=False)
    assert seen == [(False, None)]  # (the plain test: no ceilings, no aim)


def test_near_threshold_subsets_are_never_counted_full_rank_when_the_svd_says_dependent():
    """Every subset's ratio is within 2x of rtol on either side, and the grid points 0.5, 1 and 2 sit
    among them (0.5, 1.0 and 2.0 exactly, up to rounding): each grid fraction must still equal the
    float64 SVD's verdict. The reference is torch's SVD, the one the library decides ties with; NumPy's
    (another LAPACK build, whose kernels depend on the CPU) must agree wherever the ratio is farther from
    the grid point than the two SVDs' own rounding, k eps relative to sigma_1, and may differ inside it
    (seen: 2.000000000000018 x rtol in NumPy's against 1.9999999999999591 x rtol in torch's)."""
    k, d, rtol = 4, 6, 1e-3
    eps = np.finfo(np.float64).eps
    factors = [0.5, 0.6, 0.8, 0.9, 0.99, 1.0, 1.01, 1.1, 1.5, 1.99, 2.0, 2.01]
    blocks = [with_singular_values([1.0, 0.6, 0.3, f * rtol], k, d, seed=i) for i, f in enumerate(factors)]
    x = torch.cat(blocks)  # subset i is block i; exhaustive sampling would mix blocks, so test them alone
    for i, block in enumerate(blocks):
        res = probes.kruskal_test(block, k, subsets=1, rtol=rtol, rtol_grid=(0.5, 1.0, 2.0))
        sv = torch.linalg.svdvals(block).numpy()
        sv_numpy = np.linalg.svd(block.numpy(), compute_uv=False)
        for m, fraction in res.robustness.rtol_grid.items():
            t = m * rtol
            assert fraction == float(sv[-1] > t * sv[0]), (factors[i], m)
            if abs(sv_numpy[-1] / sv_numpy[0] - t) > 4 * k * eps:  # (outside both SVDs' rounding)
                assert fraction == float(sv_numpy[-1] > t * sv_numpy[0]), (factors[i], m)
    assert x.shape == (4 * len(factors), d)


def test_assumption2_critical_rtol_is_the_smallest_context_ratio():
    g = torch.Generator().manual_seed(6)
    contexts = torch.randn(30, 5, 9, generator=g, dtype=torch.float64)
    contexts[:, 4] = contexts[:, 3] + 1e-3 * torch.randn(30, 9, generator=g, dtype=torch.float64)  # spread
    res = probes.assumption2(contexts)
    sv = np.linalg.svd(contexts.numpy(), compute_uv=False)
    truth = (sv[:, -1] / sv[:, 0]).min()
    # a float64 Gram eigenvalue is off by (k + d) eps lambda_max, so sigma_min / sigma_max by a relative
    # (k + d) eps / (2 ratio^2) (worse than the SVD's (k + d) eps / ratio); both runs together twice that
    rel = (5 + 9) * torch.finfo(torch.float64).eps / truth**2
    assert res.robustness.critical_rtol == pytest.approx(truth, rel=rel)
    assert res.robustness.critical_rtol_low <= truth * (
        1 + 1e-9
    ) and truth <= res.robustness.critical_rtol_high * (1 + 1e-9)


def test_duplicates_and_impossible_verdicts_fail_at_every_tolerance():
    x = torch.randn(20, 6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    dup = torch.cat([x, x])  # every vector twice: pairs are dependent at any tolerance
    res = probes.kruskal_test(dup, 2, subsets=2000)  # exhaustive: C(40, 2) = 780 subsets
    assert res.robustness.critical_rtol == 0.0 and math.isinf(res.robustness.verdict_margin)
    wide = probes.assumption1(x, 7, subsets=10)  # k > d
    assert wide.robustness.critical_rtol == 0.0 and set(wide.robustness.rtol_grid.values()) == {0.0}


def test_robustness_leaves_the_verdict_unchanged_and_can_be_switched_off():
    x = spread_pool(80, 12, seed=8)
    on = probes.assumption1(x, 12, subsets=300, seed=1)
    off = probes.assumption1(x, 12, subsets=300, seed=1, robustness=False)
    for key in ("share_meets_threshold", "statement", "fraction", "witness", "rank_counts", "stages",
                "subsets"):
        assert getattr(on, key) == getattr(off, key), key
    assert off.robustness.rtol_grid is None and math.isnan(off.robustness.critical_rtol)
    assert on.min_margin >= off.min_margin - 1e-12  # the exact margin is never below the proven bound


def test_to_dict_is_typed_and_flatten_row_writes_the_grid():
    res = probes.assumption1(spread_pool(30, 8, seed=9), 8, subsets=100, rtol_grid=(0.5, 2))
    d = res.to_dict()
    assert type(d["margin_bound"]) is bool
    assert all(type(d[key]) is float for key in ("critical_rtol", "critical_rtol_low", "critical_rtol_high",
                                                  "verdict_margin"))
    assert all(type(m) is float and type(f) is float for m, f in d["rtol_grid"].items())
    cell = probes.flatten_row(d)["rtol_grid"]
    parsed = {float(m): float(f) for m, f in (p.split(":") for p in cell.split(";"))}
    assert parsed == d["rtol_grid"]


def large_k(monkeypatch) -> None:
    """The routes taken for large k (factorisations above rtol instead of eigenvalues, stage 1b
    ceilings), on small matrices."""
    monkeypatch.setattr(probes.fast.tuning, "TUNING",
                        dataclasses.replace(probes.fast.tuning.TUNING, eigen_max_k=0, ceil_1b_k=1))


@pytest.mark.parametrize("route", ["small-k", "large-k"])
@pytest.mark.parametrize("place", [100.0, 0.01])
def test_far_flips_are_bracketed_within_ten_percent(place, route, monkeypatch):
    """A verdict whose flip lies ~100x above rtol, or ~0.01x below it (beyond the grid's ends), with
    more subsets than the exact spectra budget: the bracket closes to 10% around the float64 SVD's
    critical value (the smallest ratio), and says so."""
    if route == "large-k":
        large_k(monkeypatch)
    x = spread_pool(60, 10, seed=11)
    k, count, seed = 8, 300, 4  # (more subsets than the exact spectra budget, 64)
    r = ratios(x, probes.sample_subsets(60, k, count, seed))
    rtol = float(r.min()) / place
    res = probes.kruskal_test(x, k, subsets=count, seed=seed, rtol=rtol)
    rob = res.robustness
    slack = ratio_tol(k, 10)
    assert (res.fraction == 1.0) == (place > 1)  # the verdict: holds below the flip, fails above it
    assert rob.critical_rtol_low - slack <= r.min() <= rob.critical_rtol_high + slack
    width = probes.robust.FAR_BRACKET_WIDTH
    assert rob.critical_rtol_high <= rob.critical_rtol_low * (1 + width) * (1 + 1e-9)
    assert rob.exact(res.rtol) is True
    assert rob.verdict_margin == pytest.approx(abs(math.log10(rob.critical_rtol / rtol)))


def test_min_margin_grid_and_bracket_of_the_large_k_routes_against_the_svd(monkeypatch):
    """The large-k routes give the grid fractions of the float64 SVD, its smallest margin (exact, or a
    proven lower bound) and a bracket around its critical value."""
    large_k(monkeypatch)
    x = spread_pool(40, 10, seed=12)
    k, count, seed = 8, 400, 3
    subsets = probes.sample_subsets(40, k, count, seed)
    r = ratios(x, subsets)
    rtol = float(np.quantile(r, 0.02))  # a few subsets dependent, many within the grid above rtol
    res = probes.kruskal_test(x, k, subsets=count, seed=seed, rtol=rtol)
    assert res.fraction == (r > rtol).mean()
    mats = x.numpy()[subsets.numpy()]
    for m, fraction in res.robustness.rtol_grid.items():
        assert fraction == np.mean(np.linalg.matrix_rank(mats, rtol=m * rtol) == k), m
    sv = torch.linalg.svdvals(torch.from_numpy(mats))  # (S, k); every dependent subset is ranked here
    _, margins = probes.rank.margins_from_singular_values(sv, rtol * sv[:, 0])
    expected = float(margins.min())
    slack = ratio_tol(k, 10) / float(r.min())
    assert res.min_margin <= expected + slack
    if not res.robustness.margin_bound:
        assert res.min_margin == pytest.approx(expected, abs=slack)
    assert res.robustness.critical_rtol_low <= r.min() * (1 + 1e-9) <= res.robustness.critical_rtol_high


def token_pool(n: int, d: int, seed: int) -> torch.Tensor:
    """Vectors like a pretrained layer's tokens: one common direction, small residuals around it (so
    the row-sum bound on each subset's lambda_max is tight, and every ratio lies far above rtol)."""
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(1, d, generator=g)
    return (mean + 1e-2 * torch.randn(n, d, generator=g)).float()


@pytest.mark.parametrize("aim", [True, False, "small chunks"])
@pytest.mark.parametrize("threshold", [1.0, 0.99])
def test_the_aim_brackets_a_far_flip_among_many_subsets_from_the_certificates(aim, threshold, monkeypatch):
    """More subsets than the far bracket's spectra budget, every ratio far above rtol: with the aim the
    test certifies near the critical tolerance and the bracket (around the float64 SVD's critical value)
    closes to 10%, where without it (at a threshold below 1, whose flip is not the one smallest ratio
    the lowest-bounded subsets' spectra find) it stays open; the verdict, fraction, witness, rank
    histogram and grid are the same either way."""
    if not aim:
        monkeypatch.setattr(probes.fast.tuning, "TUNING",
                            dataclasses.replace(probes.fast.tuning.TUNING, aim_sample=0))
    if aim == "small chunks":  # chunks (and the pool's buffers) smaller than the sample, one thread
        monkeypatch.setattr(probes.fast.tuning, "TUNING",
                            dataclasses.replace(probes.fast.tuning.TUNING, cache_bytes=8 * 16 * 16 * 5))
        monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    x = token_pool(300, 24, seed=6)
    k, count, seed = 16, 2000, 1
    r = np.sort(ratios(x, probes.sample_subsets(300, k, count, seed)))[::-1]  # descending
    res = probes.assumption1(x, k, subsets=count, seed=seed, threshold=threshold)
    plain = probes.assumption1(x, k, subsets=count, seed=seed, threshold=threshold, robustness=False)
    rob = res.robustness
    truth = r[math.ceil(threshold * count) - 1]
    slack = ratio_tol(k, 24)
    assert truth > 20 * res.rtol  # far above the grid
    assert rob.critical_rtol_low - slack <= truth <= rob.critical_rtol_high + slack
    assert (res.share_meets_threshold, res.fraction, res.witness, res.rank_counts) == (
        plain.share_meets_threshold, plain.fraction, plain.witness, plain.rank_counts)
    assert set(rob.rtol_grid.values()) == {1.0}
    width = probes.robust.FAR_BRACKET_WIDTH
    closed = rob.critical_rtol_high <= rob.critical_rtol_low * (1 + width) * (1 + 1e-9)
    assert closed == (rob.exact(res.rtol) is True)
    if aim:
        assert closed
    elif threshold < 1:
        assert not closed  # (what the aim is for: the smallest ratio alone the spectra of the lowest find)


@pytest.mark.parametrize("over", [6.0, 0.0])
def test_the_aim_lets_a_few_times_the_critical_share_fail_where_the_ratios_lie_close(over, monkeypatch):
    """Ratios packed close (the 1% and 10% quantiles within 13%, as on pretrained tokens) at threshold
    0.99: certifying below the sample's smallest ratio leaves too few subsets below the certified level
    for the bracket's upper end (``aim_over`` 0: the bracket stays open); aiming where a few times the
    critical share of the sample fails makes the q-th smallest ratio one of those spectra, and the
    bracket closes around the float64 SVD's critical value. Verdict, fraction and grid are the same."""
    monkeypatch.setattr(probes.fast.tuning, "TUNING",
                        dataclasses.replace(probes.fast.tuning.TUNING, aim_over=over))
    x = token_pool(400, 64, seed=6)
    k, count, seed = 32, 5000, 1
    r = np.sort(ratios(x, probes.sample_subsets(400, k, count, seed)))
    q = probes.robust.critical_rank(0.99, count)
    assert r[q - 1] / r[10 * q] > 0.85  # (the quantiles lie close)
    res = probes.assumption1(x, k, subsets=count, seed=seed)
    plain = probes.assumption1(x, k, subsets=count, seed=seed, robustness=False)
    rob, slack = res.robustness, ratio_tol(k, 64)
    assert rob.critical_rtol_low - slack <= r[q - 1] <= rob.critical_rtol_high + slack
    assert r[q - 1] > 20 * res.rtol  # far above the grid
    assert (res.share_meets_threshold, res.fraction, res.witness, res.rank_counts) == (
        plain.share_meets_threshold, plain.fraction, plain.witness, plain.rank_counts)
    assert set(rob.rtol_grid.values()) == {1.0}
    assert rob.exact(res.rtol) is (over > 0)
    # the smallest margin stays exact: the subsets that failed the aim (certified only at the usual
    # level) are certified once at the best exact ratio, and the few left get spectra
    assert rob.margin_bound is False
    assert res.min_margin == pytest.approx(math.log10(r[0] / res.rtol), abs=slack / r[0])


def test_the_smallest_margin_stays_exact_when_more_subsets_fail_the_aim_than_spectra_allow(monkeypatch):
    """A spectra budget smaller than the subsets that fail the aim (certified only at the usual level,
    so their lower ends lie below the best exact margin): one certificate each at the best exact ratio
    rules out all but a few, which get spectra, and the smallest margin is the float64 SVD's, exact."""
    monkeypatch.setattr(probes.robust, "_SPECTRA_SHARE", 70)  # (71 spectra for 5000 subsets)
    monkeypatch.setattr(probes.robust, "_MIN_SPECTRA", 16)
    x = token_pool(400, 64, seed=6)
    k, count, seed = 32, 5000, 1
    r = np.sort(ratios(x, probes.sample_subsets(400, k, count, seed)))
    res = probes.assumption1(x, k, subsets=count, seed=seed)
    assert res.robustness.margin_bound is False
    assert res.min_margin == pytest.approx(math.log10(r[0] / res.rtol), abs=ratio_tol(k, 64) / r[0])


@pytest.mark.parametrize("sweep", [True, False])
def test_assumption2_far_bracket_closes_by_one_certificate_per_open_context(sweep, monkeypatch):
    """Contexts whose smallest ratio lies far above rtol and whose margin bounds are loose: the spectra
    of the lowest-bounded contexts give the upper end, and one certificate per context just below it
    (where the certificate proves the known ratios above it) closes the bracket to 10% around the float64
    SVD's smallest ratio; without that sweep it stays the proven, open one."""
    if not sweep:
        monkeypatch.setattr(probes.robust._Refiner, "_certificate_pays", lambda self, t, width: False)
    g = torch.Generator().manual_seed(3)
    contexts = (torch.randn(1000, 1, 96, generator=g) + 1e-2 * torch.randn(1000, 32, 96, generator=g)).float()
    sv = np.linalg.svd(contexts.double().numpy(), compute_uv=False)
    truth = (sv[:, -1] / sv[:, 0]).min()
    res = probes.assumption2(contexts, threshold=1.0)  # (every context: the smallest ratio decides)
    rob, slack = res.robustness, ratio_tol(32, 96)
    assert truth > 20 * res.rtol
    assert rob.critical_rtol_low - slack <= truth <= rob.critical_rtol_high + slack
    assert res.fraction == 1.0 and set(rob.rtol_grid.values()) == {1.0}
    assert rob.exact(res.rtol) is sweep


def test_the_sweep_is_skipped_where_the_certificate_is_loose():
    """Random Gaussian vectors: the row-sum bound on lambda_max lies 2-3x above it, so a certificate
    just below the upper end proves nothing; the far bracket stays the proven one without a sweep."""
    calls = []
    orig = probes.robust._Refiner.test_at

    def spy(self, pos, t):
        calls.append(pos.numel())
        return orig(self, pos, t)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 64, generator=g, dtype=torch.float64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(probes.robust._Refiner, "test_at", spy)
        res = probes.assumption1(x, 16, subsets=3000, seed=0)
    r = np.sort(ratios(x, probes.sample_subsets(200, 16, 3000, 0)))
    truth = r[probes.robust.critical_rank(0.99, 3000) - 1]
    rob = res.robustness
    assert rob.critical_rtol_low <= truth * (1 + 1e-9) and truth <= rob.critical_rtol_high * (1 + 1e-9)
    assert sum(calls) < 3000 // 4  # (no certificate per subset)


@pytest.mark.parametrize("case", ["far above", "all dependent"])
def test_exact_robustness_closes_the_brackets_the_work_caps_leave_open(case):
    """robustness="exact" lifts the work caps: a bracket the default leaves as the proven one closes
    around the float64 SVD's critical value, and every other number stays as the default gives it."""
    if case == "far above":  # many subsets near the flip, far above rtol
        x, k, threshold = spread_pool(60, 12, seed=8), 10, 0.9
        count, rtol = 2000, None
    else:  # every subset dependent by interlacing: rank 6 plus noise, k = 8
        g = torch.Generator().manual_seed(3)
        x = torch.randn(40, 6, generator=g, dtype=torch.float64) @ torch.randn(6, 12, generator=g,
                                                                                dtype=torch.float64)
        x = x + 1e-9 * torch.randn(40, 12, generator=g, dtype=torch.float64)
        k, threshold, count, rtol = 8, 0.9, 300, 1e-6
    subsets = probes.sample_subsets(x.shape[0], k, count, 2)
    r = np.sort(ratios(x, subsets))[::-1]  # descending
    default = probes.assumption1(x, k, subsets=count, seed=2, threshold=threshold, rtol=rtol)
    exact = probes.assumption1(x, k, subsets=count, seed=2, threshold=threshold, rtol=rtol,
                               robustness="exact")
    truth = r[math.ceil(threshold * count) - 1]
    rob = exact.robustness
    assert default.robustness.exact(default.rtol) is False  # (what "exact" is for)
    assert rob.exact(exact.rtol) is True and rob.margin_bound is False
    slack = ratio_tol(k, 12)
    assert rob.critical_rtol_low - slack <= truth <= rob.critical_rtol_high + slack
    low, high = default.robustness.critical_rtol_low, default.robustness.critical_rtol_high
    assert low - slack <= truth <= high + slack
    assert (exact.share_meets_threshold, exact.fraction, exact.witness is None) == (
        default.share_meets_threshold, default.fraction, default.witness is None)
    assert exact.robustness.rtol_grid == default.robustness.rtol_grid
    if case == "far above":
        assert exact.witness == default.witness and exact.rank_counts == default.rank_counts


def test_robustness_accepts_true_false_and_exact_only():
    x = spread_pool(20, 6, seed=1)
    for bad in ("yes", 1, None, "Exact"):
        with pytest.raises(ValueError, match="robustness must be True, False or 'exact'"):
            probes.kruskal_test(x, 4, subsets=10, robustness=bad)
    assert probes.kruskal_test(x, 4, subsets=10, robustness=np.bool_(False)).robustness.rtol_grid is None
