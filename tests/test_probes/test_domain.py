"""The domain of the certificates: what each entry point proves at the edges of its input (a tolerance of
0, zero vectors and contexts, extreme dynamic range), and the one-line errors for what it refuses."""

from __future__ import annotations

import dataclasses
import itertools
import math
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
    assert gp.robustness.critical_rtol_low == 0.0 and not gp.share_meets_threshold
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


# ------------------------------------------------------------------ issue 39: conventions and small pools

def test_one_calling_convention_for_the_sampled_tests():
    """Data, the test's sizes, then subsets, seed and rtol by position where a test has them (keywords
    work as well); everything else by keyword only."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(12, 5, generator=g, dtype=torch.float64)
    contexts = torch.randn(12, 3, 5, generator=g, dtype=torch.float64)
    rtol = 1e-10
    by_kw = dict(subsets=40, seed=3, rtol=rtol)
    pairs = [
        (probes.kruskal_test(q, 3, 40, 3, rtol), probes.kruskal_test(q, k=3, **by_kw)),
        (probes.assumption1(q, 3, 40, 3, rtol), probes.assumption1(q, n=3, **by_kw)),
        (probes.assumption3(contexts, q, 3, 40, 3, rtol), probes.assumption3(contexts, q, n=3, **by_kw)),
        (probes.general_position(q, 40, 3, rtol), probes.general_position(q, **by_kw)),
        (probes.assumption2(contexts, rtol), probes.assumption2(contexts, rtol=rtol)),
    ]
    for a, b in pairs:
        assert {k: v for k, v in a.to_dict().items() if k != "seconds"} == {
            k: v for k, v in b.to_dict().items() if k != "seconds"}
        assert a.rtol == rtol
    lb = probes.kruskal_lower_bound(q, 3, rtol, max_subsets=0)
    assert (lb.rtol, lb.k_max) == (rtol, 3)
    with pytest.raises(TypeError):
        probes.assumption1(q, 3, 40, 3, rtol, 0.99)  # (threshold: keyword only)


def test_every_test_defaults_to_one_threshold():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(30, 4, generator=g)
    contexts = torch.randn(100, 2, 4, generator=g)
    contexts[7] = 0  # one context of 100 rank-deficient: 0.99 of them have rank n
    results = [probes.assumption1(q, 2), probes.assumption3(contexts[:30], q, 2), probes.general_position(q),
               probes.assumption2(contexts)]
    assert {r.threshold for r in results} == {probes.DEFAULT_THRESHOLD} == {0.99}
    a2 = results[-1]
    assert a2.fraction == 0.99 and a2.share_meets_threshold and a2.witness == (7,)
    every = probes.assumption2(contexts, threshold=1.0)  # (every context: the statement itself)
    assert not every.share_meets_threshold and every.statement == "refuted"


def test_critical_rtol_is_empty_where_only_a_bracket_is_known():
    """A wide proven bracket (the work caps reached): critical_rtol NaN (an empty CSV cell), the bracket
    kept, verdict_margin the proven distance from rtol to the bracket."""
    from probes.robust import Robustness, critical_is_exact, verdict_distance

    assert verdict_distance(math.nan, 1e-6, 1e-4, 1e-3) == pytest.approx(2.0)
    assert verdict_distance(math.nan, 1e-2, 1e-4, 1e-3) == pytest.approx(1.0)
    assert verdict_distance(math.nan, 5e-4, 1e-4, 1e-3) == 0.0
    assert critical_is_exact(math.nan, 1e-4, 1e-3, 1e-6) is False
    assert critical_is_exact(math.nan, math.nan, math.nan, 1e-6) is None
    rob = Robustness(margin_bound=False, critical_rtol=math.nan, critical_rtol_low=1e-4,
                     critical_rtol_high=1e-3, verdict_margin=2.0)
    res = dataclasses.replace(probes.kruskal_test(torch.eye(3), 2, robustness=False), robustness=rob)
    row = probes.flatten_row(res.to_dict())
    assert math.isnan(row["critical_rtol"]) and row["critical_rtol_exact"] is False
    assert "critical_rtol in [0.0001, 0.001] (bracket only" in repr(res)
    # a pool whose bracket the caps leave open: a tight Gaussian pool at the paper's scale is not needed;
    # every reported critical_rtol is inside its bracket or NaN
    x = torch.randn(40, 8, generator=torch.Generator().manual_seed(4))
    for k in (4, 8):
        r = probes.kruskal_test(x, k, subsets=300).robustness
        assert math.isnan(r.critical_rtol) or r.critical_rtol_low <= r.critical_rtol <= r.critical_rtol_high
        assert math.isnan(r.critical_rtol) == (r.exact(probes.default_rtol(k, 8, torch.float32)) is False)


def test_a_small_pool_gets_the_exact_answer_first():
    """12 vectors in R^6: the exhaustive search (2,443 subsets) costs less than the whitened and
    null-space proofs, so it runs first and answers exactly."""
    x = torch.randn(12, 6, generator=torch.Generator().manual_seed(0))
    lower = probes.kruskal_lower_bound(x)
    assert (lower.lower, lower.exact, lower.method) == (probes.kruskal_rank_exact(x), True, "exhaustive")
    assert lower.nullspace_programs == 0 and lower.seconds < 5.0
    x[5] = x[0] + x[1]  # a dependent triple: the search stops at it
    lower = probes.kruskal_lower_bound(x)
    assert (lower.lower, lower.exact) == (2, True) and probes.check_witness(x, lower.witness)


# ------------------------------------------------------------------ issue 41: inputs refused in one line

@pytest.mark.parametrize(
    ("make", "error", "fragment"),
    [
        (lambda: torch.empty(6, 4, device="meta"), ValueError, "meta device"),
        (lambda: torch.randn(6, 4).to_sparse(), ValueError, "sparse tensor"),
        (lambda: torch.randn(6, 4).to(torch.complex64), ValueError, "valid dtypes: bool"),
        (lambda: torch.randn(6, 4).to(torch.float8_e4m3fn), TypeError, "valid dtypes: bool"),
        (lambda: __import__("numpy").zeros((6, 4), dtype="uint32"), TypeError, "valid dtypes: bool"),
    ],
)
def test_inputs_no_proof_covers_are_refused_in_one_line(make, error, fragment):
    for call in (lambda x: probes.kruskal_test(x, 2), lambda x: probes.numerical_rank(x),
                 lambda x: probes.kruskal_lower_bound(x), lambda x: probes.effective_rank(x)):
        with pytest.raises(error, match=re.escape(fragment)) as info:
            call(make())
        assert "\n" not in str(info.value)


def test_mismatched_contexts_and_queries_are_refused():
    q = torch.randn(6, 4)
    for contexts, fragment in ((torch.randn(5, 3, 4), "contexts hold N = 5"),
                               (torch.randn(6, 3, 5), "width d = 5")):
        with pytest.raises(ValueError, match=re.escape(fragment)):
            probes.token_geometry(contexts, q)
        with pytest.raises(ValueError, match="do not match"):
            probes.assumption3(contexts, q, 2)


def test_values_beyond_one_float64_scale_are_refused_everywhere():
    """A pool, matrix or context whose values span more than 2^1021 once brought to one scale: the
    entries that scale loses are refused with one ValueError that names the range."""
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    x[0] *= 1e250
    x[1] *= 1e-70
    contexts = x.reshape(3, 2, 4)
    for call in (lambda: probes.kruskal_test(x, 2), lambda: probes.kruskal_rank_exact(x),
                 lambda: probes.kruskal_lower_bound(x), lambda: probes.numerical_rank(x),
                 lambda: probes.general_position(x), lambda: probes.assumption2(contexts),
                 lambda: probes.context_ranks(contexts),
                 lambda: probes.assumption3(contexts, x[3:] * 1e200, 2)):
        with pytest.raises(ValueError, match=re.escape("float64 holds at most a ratio of 2^1021")) as info:
            call()
        assert "\n" not in str(info.value)
    x[1] *= 1e70 * 1e-50  # within 2^1021 of the largest: covered
    assert probes.kruskal_test(x, 2).fraction < 1.0  # (the 1e250 vector with any other: below rtol)
