"""Stage 1b at the robustness grid's lowest point (the dip, probes.fast.decide) and eigenvalues for the
grid's points above rtol at large k (probes.robust): the same ranks as without them, ceilings that the
float64 SVD never exceeds, grid fractions equal to NumPy's and brackets around the SVD's critical value."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import with_singular_values

import probes
from probes import fast

DIP = 0.1 * (1 - 1e-6)  # what kruskal_test passes for the default grid


def tune(monkeypatch, **changes) -> None:
    monkeypatch.setattr(fast.tuning, "TUNING", dataclasses.replace(fast.tuning.TUNING, **changes))


def svd_ratios(x: torch.Tensor, subsets: torch.Tensor) -> torch.Tensor:
    """sigma_k / sigma_1 of every subset by the float64 SVD: (S,)."""
    sv = torch.linalg.svdvals(x[subsets])  # (S, k)
    return sv[:, -1] / sv[:, 0]


# factors of rtol: below the dip (proven there), between the dip and rtol, above rtol
FACTORS = [0.0, 1e-4, 0.01, 0.05, 0.09, 0.2, 0.5, 0.9, 1.5, 3.0, 20.0]


@pytest.mark.parametrize("rtol", [1e-3, 1e-6])
@pytest.mark.parametrize("ceilings", [False, True])
def test_dip_changes_no_rank_and_proves_only_what_lies_below_it(rtol, ceilings):
    """Stage 1b at the dip first proves the matrices below dip x rtol (none at rtol = 1e-6, where the
    dip lies below the Gram route's resolution), each also one that stage 1b proves at rtol: the ranks
    equal those without the dip; each proven one gets a ceiling below the dip that the float64 SVD's
    ratio never exceeds."""
    k, d = 4, 9
    blocks = [with_singular_values([1.0, 0.4, 0.1, f * rtol], k, d, seed=i) for i, f in enumerate(FACTORS)]
    x = torch.stack(blocks)  # (B, k, d)
    gram = x @ x.transpose(1, 2)  # (B, k, k)

    def decide(dip):
        return fast.decide(gram.clone(), lambda pos: x[pos], rtol, d, exact_dependent=0, dependent_first=True,
                           ceilings=ceilings, dip=dip)

    plain, dipped = decide(None), decide(DIP)
    assert dipped.rank.tolist() == plain.rank.tolist()
    assert dipped.stages == plain.stages
    assert plain.dip_tried == 0 and dipped.dip_tried == len(FACTORS)  # (stage 1b first: every matrix)
    sv = torch.linalg.svdvals(x)  # (B, k)
    ratio = sv[:, -1] / sv[:, 0]
    below = sum(f < 0.1 for f in FACTORS)
    assert dipped.dip_proven == (below if rtol == 1e-3 else 0)  # (1e-6: the dip below the resolution)
    if ceilings:
        proven = dipped.ceiling <= DIP * rtol
        assert int(proven.sum()) >= dipped.dip_proven
        assert torch.all(dipped.ceiling[proven] >= ratio[proven] * (1 - 1e-9))
        assert not dipped.ceiling.isnan().any()


def cluster_pool(n: int, d: int, r: int, seed: int) -> torch.Tensor:
    """Half the vectors in an r-dimensional subspace (float32-rounded): subsets holding more than r of
    them are dependent, exactly."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    x[: n // 2] = torch.randn(n // 2, r, generator=g, dtype=torch.float64) @ torch.randn(
        r, d, generator=g, dtype=torch.float64)
    return x.float().double()


@pytest.mark.parametrize("dependent_first", [False, True])
def test_dip_in_the_subset_test_keeps_ranks_stage_counts_and_ceilings_proven(dependent_first, monkeypatch):
    """The k-subset test with the dip: ranks and stage 1b counts equal the test without it (in many
    chunks on two threads), and every ceiling is at or above the float64 SVD's ratio."""
    share = 0.0 if dependent_first else 2.0  # stage 1b first in every chunk, or never
    tune(monkeypatch, cache_bytes=8 * 12 * 12 * 7, ceil_1b_k=1, dependent_first_floor=share,
         dependent_first_plain=share, dependent_first_settled=2.0)
    x = cluster_pool(60, 24, 6, seed=31)
    k, rtol = 12, 1e-4
    subsets = probes.sample_subsets(60, k, 400, seed=32)
    plain = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=0, ceilings=True, workers=2)
    dipped = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=0, ceilings=True, workers=2,
                                   dip=DIP)
    assert torch.equal(plain.rank, dipped.rank)
    assert plain.stages == dipped.stages
    assert plain.dip_tried == 0 and (dipped.dip_proven > 20 if dependent_first else True)
    ratio = svd_ratios(x, subsets)
    proven = dipped.rank == -1
    assert torch.all(dipped.ceiling[proven] >= ratio[proven] * (1 - 1e-9))
    below = dipped.ceiling[proven] <= DIP * rtol
    assert below.double().mean() >= (plain.ceiling[proven] <= DIP * rtol).double().mean()


def square_pool(n: int, d: int, seed: int) -> torch.Tensor:
    """Like a ViT block's CLS outputs (a common mean, a spectrum falling one decade): at k = d most
    subsets are dependent at a tolerance well above their ratios."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.logspace(0, -1, d, dtype=torch.float64)
    return x + 3 * torch.randn(1, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("route", ["small-k", "large-k"])
def test_general_position_grid_and_bracket_with_the_dip(route, monkeypatch):
    """k = d, every subset dependent with its ratio below 0.1 x rtol: the test proves them at the dip,
    so the grid's lowest point needs no new factorisation; every grid fraction equals NumPy's, and the
    critical bracket holds the SVD's smallest ratio with its upper end below the dip."""
    tune(monkeypatch, cache_bytes=8 * 10 * 10 * 5)
    if route == "large-k":
        tune(monkeypatch, eigen_max_k=0, ceil_1b_k=1)
    n, k, count, seed = 200, 10, 300, 6  # (a pool this large: its spectrum alone proves nothing)
    x = square_pool(n, k, seed=7)
    subsets = probes.sample_subsets(n, k, count, seed)
    r = svd_ratios(x, subsets).numpy()
    rtol = float(r.max()) * 12  # every ratio below rtol / 12
    decided = []
    original = probes.robust._Refiner.decide_at

    def counted(self, pos, t):
        decided.append((t / self.rtol, int(pos.numel())))
        return original(self, pos, t)

    monkeypatch.setattr(probes.robust._Refiner, "decide_at", counted)
    res = probes.kruskal_test(x, k, subsets=count, seed=seed, rtol=rtol, rank_sample=10)
    mats = x.numpy()[subsets.numpy()]
    for m, fraction in res.robustness.rtol_grid.items():
        assert fraction == np.mean(np.linalg.matrix_rank(mats, rtol=m * rtol) == k), m
    rob = res.robustness
    assert res.fraction == 0.0 and "interlacing" not in res.note and "every 10-subset" not in res.note
    assert rob.critical_rtol_low <= r.min() * (1 + 1e-9) and r.min() <= rob.critical_rtol_high * (1 + 1e-9)
    assert rob.critical_rtol_high < 0.1 * rtol  # (a grid decision at the dip would leave it at 0.1 x rtol)
    redone = sum(c for m, c in decided if m < 0.11)
    assert redone <= count // 10  # the dip settled the grid's lowest point for nearly every subset


@pytest.mark.parametrize("span", [2, 99])
def test_large_k_grid_by_eigenvalues_or_factorisations_equals_numpy(span, monkeypatch):
    """Above rtol at large k, matrices whose interval holds ``eigen_span`` grid points get eigenvalue
    brackets (span 2), or factorisations point by point (span 99): the same fractions as NumPy's
    matrix_rank at every grid tolerance, and a bracket around the SVD's critical value."""
    tune(monkeypatch, eigen_max_k=0, ceil_1b_k=1, eigen_span=span)
    g = torch.Generator().manual_seed(41)
    x = torch.randn(60, 10, generator=g, dtype=torch.float64) * torch.logspace(0, -4, 10, dtype=torch.float64)
    k, count, seed = 10, 500, 7
    subsets = probes.sample_subsets(60, k, count, seed)
    r = svd_ratios(x, subsets).numpy()
    rtol = float(np.quantile(r, 0.3))
    res = probes.kruskal_test(x, k, subsets=count, seed=seed, rtol=rtol)
    mats = x.numpy()[subsets.numpy()]
    for m, fraction in res.robustness.rtol_grid.items():
        assert fraction == np.mean(np.linalg.matrix_rank(mats, rtol=m * rtol) == k), m
    assert 0 < res.robustness.rtol_grid[2.0] < res.robustness.rtol_grid[1.0]  # ratios across the points
    rob = res.robustness
    assert rob.critical_rtol_low <= r.min() * (1 + 1e-9) and r.min() <= rob.critical_rtol_high * (1 + 1e-9)


# ------------------------------------------------------------------ ceilings from the rows (grid below rtol)


@pytest.mark.parametrize("loop_k", [10**9, 1])
def test_exposed_ceilings_hold_and_reach_below_the_gram_resolution(loop_k, monkeypatch):
    """A failed factorisation at t^2 lam_lo exposes a vector whose bound from the rows is a ceiling at
    or above the float64 SVD's ratio, far below the Gram route's resolution for rows dependent up to
    rounding; where the factorisation succeeds (ratio above t), no ceiling (1). ``loop_k``: the
    ceilings' kernels batched or matrix by matrix (``Tuning.ceiling_loop_k``)."""
    tune(monkeypatch, ceiling_loop_k=loop_k)
    k, d, t = 4, 9, 1e-3
    factors = [0.0, 1e-13, 1e-10, 1e-6, 1e-4, 2e-4, 0.05, 0.3]
    x = torch.stack([with_singular_values([1.0, 0.4, 0.1, f], k, d, seed=i) for i, f in enumerate(factors)])
    gram = x @ x.transpose(1, 2)  # (B, k, k)
    shift = t**2 * fast.kernels.power_lower(gram)
    ceiling = fast.kernels.exposed_ceilings(gram, shift, d, rows=lambda p: x[p])
    sv = torch.linalg.svdvals(x)
    ratio = sv[:, -1] / sv[:, 0]
    assert torch.all(ceiling >= ratio * (1 - 1e-9))
    resolution = (16 * (k + d) * torch.finfo(torch.float64).eps) ** 0.5  # (about 1.7e-7 here)
    for f, c in zip(factors, ceiling.tolist(), strict=True):
        if f <= 1e-10:
            assert c < resolution / 10, f
        if f <= t / 4:
            assert c < t, f
        if f >= 0.05:
            assert c == 1.0, f


def test_grid_below_rtol_takes_ceilings_from_the_rows_where_the_gram_route_cannot_reach(monkeypatch):
    """Dependent subsets (float32-rounded subspace) at a tolerance whose 0.1x point lies below the
    Gram route's resolution, with the test's own ceilings left at the Gram route's (no rows read): the
    grid's lowest point takes ceilings from the rows, each at or above the float64 SVD's ratio and most
    below the point; every grid fraction equals NumPy's."""
    tune(monkeypatch, ceiling_enough=1e12, cache_bytes=8 * 12 * 12 * 7)
    x = cluster_pool(60, 24, 6, seed=51)
    k, count, seed, rtol = 12, 300, 52, 1e-6
    subsets = probes.sample_subsets(60, k, count, seed)
    ratio = svd_ratios(x, subsets)
    seen = []
    original = probes.robust._Refiner._expose

    def recorded(self, pos, t):
        before = self.hi[pos].clone()
        out = original(self, pos, t)
        seen.append((t, pos, before, self.hi[pos].clone(), self.hi.clone()))
        return out

    monkeypatch.setattr(probes.robust._Refiner, "_expose", recorded)
    res = probes.kruskal_test(x, k, subsets=count, seed=seed, rtol=rtol)
    mats = x.numpy()[subsets.numpy()]
    for m, fraction in res.robustness.rtol_grid.items():
        assert fraction == np.mean(np.linalg.matrix_rank(mats, rtol=m * rtol) == k), m
    assert seen and seen[0][0] == pytest.approx(0.1 * rtol)
    t, pos, before, after, hi = seen[0]
    assert torch.all(hi >= ratio * (1 - 1e-9))  # every interval still holds its ratio
    assert (before > t).all() and (after < t).double().mean() > 0.75
    rob = res.robustness
    assert rob.critical_rtol_low <= ratio.min() * (1 + 1e-9) <= rob.critical_rtol_high * (1 + 1e-9)
