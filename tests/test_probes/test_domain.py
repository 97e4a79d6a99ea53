"""The domain of the certificates: what each entry point proves at the edges of its input (a tolerance of
0, zero vectors and contexts, extreme dynamic range), and the one-line errors for what it refuses."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

import probes

ENTRY_POINTS = {
    "kruskal_test": lambda x, **kw: probes.kruskal_test(x, 2, **kw),
    "kruskal_sweep": lambda x, **kw: probes.kruskal_sweep(x, [1, 2], **kw),
    "kruskal_rank_exact": lambda x, **kw: probes.kruskal_rank_exact(x, **kw),
    "kruskal_lower_bound": lambda x, **kw: probes.kruskal_lower_bound(x, **kw),
    "assumption1": lambda x, **kw: probes.assumption1(x, 2, **kw),
    "general_position": lambda x, **kw: probes.general_position(x, **kw),
    "assumption2": lambda x, **kw: probes.assumption2(x.reshape(3, 2, 4), **kw),
    "assumption3": lambda x, **kw: probes.assumption3(x.reshape(3, 2, 4), x[:3], 2, **kw),
    "context_ranks": lambda x, **kw: probes.context_ranks(x.reshape(3, 2, 4), **kw),
    "numerical_rank": lambda x, **kw: probes.numerical_rank(x, **kw),
    "check_witness": lambda x, **kw: probes.check_witness(x, (0, 1), **kw),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_rtol_zero_is_refused_in_one_line(name):
    """At rtol = 0 every nonzero float64 singular value counts, rounding noise included: no verdict there
    can be proven, so every entry point refuses it with the same ValueError (not a ZeroDivisionError)."""
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.raises(ValueError, match=re.escape("rtol must be a finite number in (0, 1), got 0")) as info:
        ENTRY_POINTS[name](x, rtol=0)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=re.escape("(0, 1)")):
        ENTRY_POINTS[name](x, rtol=0.0)


# ------------------------------------------------------------------ dynamic range (class 1)

def svd_ratio(rows: torch.Tensor) -> float:
    """sigma_k / sigma_1 of (k, d) float64 rows by a float64 SVD of the rows rescaled to an ordinary
    scale first (an exact power of two: the ratio is unchanged)."""
    scale = float(rows.abs().max())
    if scale == 0:
        return 0.0
    sv = torch.linalg.svdvals(rows * 2.0 ** -torch.frexp(torch.tensor(scale)).exponent.item())
    return float(sv[-1] / sv[0])


@pytest.mark.parametrize("decades", [90, 120, 154, 160, 170, 200, 300])
def test_a_tiny_vector_keeps_its_rank_at_every_entry_point(decades):
    """A vector 10^-decades times the largest: its square underflows at 1e-160 and beyond, yet it is a
    nonzero vector (rank 1), and the pair it forms with a parallel big vector is dependent."""
    s = 10.0**-decades
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [s, 0.0]], dtype=torch.float64)
    one = probes.kruskal_test(x, 1)
    assert (one.fraction, one.witness) == (1.0, None)
    assert one.robustness.critical_rtol_low <= 1.0 <= one.robustness.critical_rtol_high
    assert probes.kruskal_rank_exact(x) == 1
    lower = probes.kruskal_lower_bound(x)
    assert (lower.lower, lower.exact) == (1, True) and probes.check_witness(x, lower.witness)
    two = probes.kruskal_test(x, 2)
    assert two.full_rank == 1 and probes.check_witness(x, two.witness)
    # a pool of tiny vectors only: every subset decided at its own scale
    y = torch.randn(6, 4, generator=torch.Generator().manual_seed(decades), dtype=torch.float64)
    y[3:] *= s
    for k in (1, 2, 3):
        res = probes.kruskal_test(y, k)
        ratios = [svd_ratio(y[list(c)]) for c in itertools.combinations(range(6), k)]
        assert res.fraction == sum(r > res.rtol for r in ratios) / len(ratios)
        low, high = res.robustness.critical_rtol_low, res.robustness.critical_rtol_high
        assert low <= min(ratios) * (1 + 1e-9) and min(ratios) <= high * (1 + 1e-9)
    assert probes.kruskal_rank_exact(y) == probes.kruskal_lower_bound(y).lower == 1


def test_a_pool_of_only_tiny_vectors_is_decided_like_the_same_pool_at_scale_one():
    x = torch.randn(7, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x[6] = x[0] + x[1]
    small = x * 2.0**-600
    for k in (2, 3, 4):
        a, b = probes.kruskal_test(x, k), probes.kruskal_test(small, k)
        assert (a.fraction, a.rank_counts, a.witness) == (b.fraction, b.rank_counts, b.witness)
    assert probes.kruskal_rank_exact(small) == probes.kruskal_rank_exact(x) == 2
    assert probes.kruskal_lower_bound(small).lower <= 2


# ------------------------------------------------------------------ zero vectors and contexts (class 2)

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_zero_vectors_and_contexts_have_critical_tolerance_zero(dtype):
    """A zero vector (k = 1), k zero vectors (k = d, general position) or an all-zero context fail at
    every tolerance: the critical tolerance is 0 and the proven bracket holds it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g).to(dtype)
    x[2] = 0
    one = probes.kruskal_test(x, 1)
    assert one.witness == (2,) and one.robustness.critical_rtol_low == 0.0
    assert one.robustness.critical_rtol == 0.0 and one.robustness.exact(one.rtol)
    x[[1, 3, 4]] = 0
    gp = probes.general_position(x)
    assert gp.robustness.critical_rtol_low == 0.0 and not gp.holds
    contexts = torch.randn(5, 3, 6, generator=g).to(dtype)
    contexts[2] = 0
    a2 = probes.assumption2(contexts)
    assert a2.witness == (2,) and a2.robustness.critical_rtol_low == 0.0 == a2.robustness.critical_rtol
    lower = probes.kruskal_lower_bound(x)
    fields = lower.to_dict()
    assert lower.lower == 0 and lower.exact and probes.check_witness(x, lower.witness)
    assert all(fields[f] == 0 for f in ("coherence_k", "babel_k", "whitened_coherence_k", "whitened_babel_k",
                                        "nullspace_k", "exhaustive_k"))


# ------------------------------------------------------------------ margins of dependent subsets (class 3)

def test_a_dependent_subsets_margin_is_exact_or_a_bound_below_the_svds():
    """Three float32 vectors in R^2, two at sigma_2 / sigma_1 = 5e-9 (below what float64 Gram eigenvalues
    resolve, about 1e-8): their margin is the distance from the threshold to sigma_2 (1.68 decades), not
    to sigma_1 (6.5)."""
    x = torch.tensor([[1.0, 0.0], [1.0, 1e-8], [0.3, 1.0]], dtype=torch.float32)
    rtol = 2 * torch.finfo(torch.float32).eps
    sv = torch.linalg.svdvals(x[:2].double())
    truth = float(torch.log10(rtol * sv[0] / sv[1]))
    exact = probes.kruskal_test(x, 2)
    assert not exact.robustness.margin_bound
    assert abs(exact.min_margin - truth) <= 1e-9 and exact.robustness.verdict_margin == pytest.approx(truth)
    plain = probes.kruskal_test(x, 2, robustness=False)
    assert plain.robustness.margin_bound and plain.min_margin <= truth
