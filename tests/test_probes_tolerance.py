"""Tolerance profiles (probes.tolerance) against plain float64 SVD on the same subsets and contexts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import probes


def _ratios(x: torch.Tensor, idx: torch.Tensor, k: int) -> np.ndarray:
    s = np.linalg.svd(x.double().numpy()[idx.numpy()], compute_uv=False)
    return s[:, k - 1] / s[:, 0]


def _spread_pool(seed: int, n_vec: int = 200, d: int = 48, decades: float = 5.3) -> torch.Tensor:
    """Columns scaled over ``decades``: subset ratios sigma_k / sigma_1 straddle 1e-4 and the grid around it."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_vec, d, generator=g, dtype=torch.float64) * torch.logspace(0, -decades, d, dtype=torch.float64)


@pytest.mark.parametrize("seed,decades", [(1, 5.3), (2, 5.6), (3, 5.9)])
def test_grid_bracket_and_margin_equal_float64_svd_on_the_same_subsets(seed, decades):
    x, k, count, rtol = _spread_pool(seed, decades=decades), 24, 2000, 1e-4
    profile = probes.kruskal_profile(x, k, subsets=count, seed=seed, rtol=rtol, max_spectra=4000)
    r = _ratios(x, probes.sample_subsets(x.shape[0], k, count, seed), k)
    assert profile.rtol_grid == {m: float((r > m * rtol).mean()) for m in probes.DEFAULT_GRID}
    required = math.ceil(0.99 * count)
    critical = np.sort(r)[::-1][required - 1]  # the verdict holds below it and fails above it
    assert profile.critical_rtol_low <= critical <= profile.critical_rtol_high
    assert profile.critical_rtol_high <= profile.critical_rtol_low * 1.06  # bracket narrowed to ~5%
    assert profile.verdict_margin == pytest.approx(abs(math.log10(profile.critical_rtol / rtol)))
    exact = np.abs(np.log10(r / rtol)).min()
    assert not profile.margin_bound and profile.min_margin == pytest.approx(exact, abs=1e-9)


def test_near_threshold_subsets_are_never_counted_full_when_svd_says_dependent():
    # ratios within 2x of rtol on both sides: the adversarial zone of any fast certificate
    x, k, count = _spread_pool(7, decades=5.45), 24, 1500
    idx = probes.sample_subsets(x.shape[0], k, count, 0)
    r = _ratios(x, idx, k)
    rtol = float(np.median(r))
    assert ((r > rtol / 2) & (r < 2 * rtol)).mean() > 0.3
    profile = probes.kruskal_profile(x, k, subsets=count, rtol=rtol, rtol_grid=(0.5, 0.7, 1, 1.4, 2))
    for m, share in profile.rtol_grid.items():
        assert share == float((r > m * rtol).mean())


def test_a_verdict_far_from_flipping_keeps_a_proven_bracket_beyond_the_grid():
    x = torch.randn(300, 64, generator=torch.Generator().manual_seed(0))
    profile = probes.kruskal_profile(x, 32, subsets=500)
    r = _ratios(x, probes.sample_subsets(300, 32, 500, 0), 32)
    assert profile.rtol_grid[10.0] == 1.0 and profile.critical_rtol_low > 10 * profile.rtol
    assert profile.critical_rtol_low <= np.sort(r)[::-1][math.ceil(0.99 * 500) - 1] <= profile.critical_rtol_high
    assert profile.min_margin <= np.abs(np.log10(r / profile.rtol)).min() + 1e-9  # exact or a lower bound


def test_duplicates_fail_at_every_tolerance():
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(0))
    x[1] = x[0]
    profile = probes.kruskal_profile(x, 40, subsets=10)  # k > d: impossible
    assert profile.critical_rtol == 0.0 and set(profile.rtol_grid.values()) == {0.0}
    profile = probes.kruskal_profile(x[:12], 12, subsets=10)  # the one subset holds both copies
    assert profile.rtol_grid[0.1] == 0.0 and profile.critical_rtol_low == 0.0


def test_context_profile_critical_is_the_smallest_context_ratio():
    g = torch.Generator().manual_seed(3)
    e = torch.randn(50, 16, 64, generator=g, dtype=torch.float64) * torch.logspace(0, -4, 64, dtype=torch.float64)
    e = e.float()
    profile = probes.context_profile(e)
    s = np.linalg.svd(e.double().numpy(), compute_uv=False)
    r = s[:, 15] / s[:, 0]
    assert profile.critical_rtol_low <= r.min() <= profile.critical_rtol_high
    assert profile.min_margin == pytest.approx(np.abs(np.log10(r / profile.rtol)).min(), abs=1e-9)
    assert profile.rtol_grid == {m: float((r > m * profile.rtol).mean()) for m in probes.DEFAULT_GRID}


def test_bad_grid_and_threshold_get_one_line_errors():
    x = torch.randn(20, 8)
    with pytest.raises(ValueError, match="rtol_grid"):
        probes.kruskal_profile(x, 4, rtol_grid=(0, 1))
    with pytest.raises(ValueError, match="threshold"):
        probes.kruskal_profile(x, 4, threshold=1.5)
