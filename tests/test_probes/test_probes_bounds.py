"""Certified Kruskal lower bounds, Clopper-Pearson intervals and duplicate counts (probes.bounds)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch
from conftest import brute_kruskal_rank
from scipy import stats
from scipy.linalg import hadamard

from probes.bounds import DuplicateCounts, KruskalLowerBound, clopper_pearson, duplicates, kruskal_lower_bound
from probes.kruskal import check_witness


def random_sets():
    """Small sets of every kind the bound must not overstate: generic, duplicated, nearly dependent,
    with a zero vector, badly scaled, nearly orthogonal (where Babel and coherence prove more than 1)."""
    g = torch.Generator().manual_seed(0)
    sets = []
    for i in range(6):
        n_vec, d = 5 + i % 4, 2 + i % 5
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(n_vec, d, generator=g, dtype=torch.float64)
            sets.append((f"generic-{i}-{dtype}", x.to(dtype)))
            sets.append((f"duplicate-{i}-{dtype}", torch.cat([x, x[1:2]]).to(dtype)))
            near = x.clone()
            near[-1] = x[0] - 0.5 * x[1] + 1e-9 * torch.randn(d, generator=g, dtype=torch.float64)
            sets.append((f"near-dependent-{i}-{dtype}", near.to(dtype)))
            sets.append(
                (f"zero-{i}-{dtype}", torch.cat([x, torch.zeros(1, d, dtype=torch.float64)]).to(dtype))
            )
    for i in range(6):
        n_vec, d = 6 + i % 3, 24 + 8 * i
        x = torch.randn(n_vec, d, generator=g, dtype=torch.float64)
        sets.append((f"near-orthogonal-{i}", x))
        scaled = x * torch.logspace(0, -3 * (i % 3), n_vec, dtype=torch.float64)[:, None]
        sets.append((f"scaled-{i}", scaled.float()))
    basis = torch.eye(5, dtype=torch.float64)
    basis[1] = 1e-7
    sets.append(("orthogonal-badly-scaled", basis.float()))  # sigma ratio 1e-7 < 5 eps32: Kruskal rank 1
    return sets


@pytest.mark.parametrize(("name", "x"), random_sets(), ids=[name for name, _ in random_sets()])
def test_lower_bound_never_exceeds_the_kruskal_rank_and_is_exact_when_searched(name, x):
    truth = brute_kruskal_rank(x)
    proven = kruskal_lower_bound(x, max_subsets=0)  # coherence and Babel only
    assert proven.lower <= truth, proven
    assert max(proven.coherence_k, proven.babel_k) <= max(truth, 1)
    if truth == 0:  # (every proof's own field agrees with the bound)
        assert max(proven.coherence_k, proven.babel_k, proven.whitened_coherence_k,
                   proven.whitened_babel_k, proven.nullspace_k, proven.exhaustive_k) == 0, proven
    if proven.exact:
        assert proven.lower == truth
    if proven.witness is not None:  # a zero vector, or the most coherent pair when dependent
        assert len(proven.witness) == proven.lower + 1 and check_witness(x, proven.witness)
    full = kruskal_lower_bound(x)  # these sets are small enough to search exhaustively
    assert (full.lower, full.exact) == (truth, True), full
    if full.witness is not None:
        assert len(full.witness) == truth + 1 and check_witness(x, full.witness)


def test_explicit_rtol_is_respected():
    x = torch.randn(7, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    x[-1] = x[0] + x[1] + 1e-6 * x[2]  # independent at float64 tolerance, dependent at rtol 1e-3
    for rtol in (None, 1e-3):
        assert kruskal_lower_bound(x, rtol=rtol).lower == brute_kruskal_rank(x, rtol)
    assert kruskal_lower_bound(x, rtol=1e-3).lower < kruskal_lower_bound(x).lower


@pytest.mark.parametrize("factor", [1 - 1e-7, 1 + 1e-7])
def test_pair_at_the_tolerance(factor):
    """For two unit vectors the Gershgorin bound is tight (sigma_2 / sigma_1 = tan(angle / 2)): just
    below rtol nothing beyond 1 may be claimed, just above it the bound proves 2."""
    rtol = 1e-3
    angle = 2 * math.atan(rtol * factor)
    x = torch.tensor([[1.0, 0.0], [math.cos(angle), math.sin(angle)]], dtype=torch.float64)
    truth = brute_kruskal_rank(x, rtol)
    assert truth == (2 if factor > 1 else 1)
    assert kruskal_lower_bound(x, rtol=rtol, max_subsets=0).lower == truth


def test_frame_of_known_coherence():
    """Spikes and a normalised Hadamard basis in R^16: mu = 1/4, so the coherence bound proves
    Kruskal rank >= 1/mu = 4 and no more (mu_1(4) = 1 is not below 1). The true Kruskal rank is 7: four
    spikes on a subgroup and four Hadamard rows on its annihilator are dependent."""
    frame = torch.cat([torch.eye(16, dtype=torch.float64),
                       torch.tensor(hadamard(16), dtype=torch.float64) / 4])  # (32, 16)
    res = kruskal_lower_bound(frame)
    assert res.coherence == pytest.approx(0.25, abs=16 * 16 * float(np.finfo(np.float64).eps))
    assert (res.coherence_k, res.babel_k, res.lower, res.method, res.exact) == (4, 4, 4, "coherence", False)
    assert "sampled" in res.note and "max_subsets" in res.note
    assert check_witness(frame, (0, 4, 8, 12, 16, 17, 18, 19))  # Kruskal rank <= 7
    assert kruskal_lower_bound(frame, max_subsets=32 + math.comb(32, 5)).lower == 5  # searched one level


def test_babel_proves_more_than_coherence():
    """One correlated pair among orthonormal vectors: mu = 0.71 proves 2, the Babel function (0.71 for
    every m) proves all 8."""
    x = torch.eye(8, dtype=torch.float64)
    x[1] = torch.nn.functional.normalize(x[0] + x[1], dim=0)
    res = kruskal_lower_bound(x, max_subsets=0)
    assert (res.coherence_k, res.babel_k, res.lower, res.method, res.exact) == (2, 8, 8, "babel", True)


def test_babel_needs_many_columns():
    """A near-orthogonal set with one correlated pair: the Babel bound passes beyond its first block of
    128 columns (and must grow them), the coherence bound stops at 2."""
    x = torch.linalg.qr(torch.randn(600, 400, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64))[0].T[:300]  # 300 orthonormal rows in R^600
    x = x + 1e-5 * torch.randn(300, 600, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x[1] = (x[0] + x[1]) / 2**0.5
    res = kruskal_lower_bound(x, max_subsets=0)
    assert (res.coherence_k, res.babel_k, res.lower, res.method, res.exact) == (2, 300, 300, "babel", True)


def test_zero_vector_and_k_max():
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    zero = kruskal_lower_bound(torch.cat([x, torch.zeros(1, 4)]))
    assert (zero.lower, zero.method, zero.exact) == (0, "trivial", True)
    capped = kruskal_lower_bound(torch.eye(6), k_max=3)
    assert (capped.lower, capped.exact) == (3, False) and "k_max" in capped.note
    tiny = kruskal_lower_bound(np.random.default_rng(0).standard_normal((3000, 2)), max_subsets=0)
    assert (tiny.lower, tiny.method) == (1, "trivial")  # honest: nothing beyond single vectors


def test_duplicated_vectors_make_the_bound_exact():
    """Identical queries (e.g. every CLS token of an embedding layer): Kruskal rank exactly 1, proven by
    the most coherent pair, without any search."""
    cls = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    x = torch.cat([torch.randn(100, 64, generator=torch.Generator().manual_seed(1)), cls, cls])
    res = kruskal_lower_bound(x, max_subsets=0)
    assert (res.lower, res.exact, res.witness, res.note) == (1, True, (100, 101), "")
    assert "Kruskal rank = 1" in repr(res)


def test_result_types_and_repr():
    res = kruskal_lower_bound(torch.randn(9, 5, generator=torch.Generator().manual_seed(0)))
    assert isinstance(res, KruskalLowerBound) and "\n" not in repr(res)
    row = res.to_dict()
    assert (
        isinstance(row["lower"], int)
        and isinstance(row["coherence"], float)
        and isinstance(row["exact"], bool)
    )
    assert row["witness"] is None or all(isinstance(i, int) for i in row["witness"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.lower = 3


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(k_max=0), "k_max must be a positive integer"),
    (dict(k_max=11), "k_max = 11 exceeds the number of vectors N = 10"),
    (dict(max_subsets=-1), "max_subsets must be an integer >= 0"),
    (dict(rtol=1.5), r"rtol must be a finite number in \(0, 1\)"),
])
def test_lower_bound_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kruskal_lower_bound(torch.randn(10, 4), **kwargs)
    with pytest.raises(ValueError, match="shape"):
        kruskal_lower_bound(torch.randn(10))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lower_bound_on_cuda_matches_cpu():
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
    cpu, gpu = kruskal_lower_bound(x, max_subsets=0), kruskal_lower_bound(x.cuda(), max_subsets=0)
    assert (cpu.lower, cpu.babel_k, cpu.coherence_k) == (gpu.lower, gpu.babel_k, gpu.coherence_k)
    assert gpu.coherence == pytest.approx(cpu.coherence, abs=64 * 8 * float(np.finfo(np.float64).eps))
    assert duplicates(x.cuda()).to_dict() | {"coherence": 0} == duplicates(x).to_dict() | {"coherence": 0}


# ---------------------------------------------------------------- clopper_pearson


@pytest.mark.parametrize(("successes", "trials", "confidence"),
                         [(1, 2, 0.95), (9, 10, 0.95), (4991, 5000, 0.95), (37, 500, 0.99), (3, 7, 0.5)])
def test_clopper_pearson_against_beta_quantiles(successes, trials, confidence):
    alpha = 1 - confidence
    low = stats.beta.ppf(alpha / 2, successes, trials - successes + 1)
    high = stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes)
    got = clopper_pearson(successes, trials, confidence)
    assert got == pytest.approx((low, high), rel=1e-9)
    assert all(isinstance(v, float) for v in got)


@pytest.mark.parametrize("trials", [1, 10, 5000])
def test_clopper_pearson_edges(trials):
    # closed forms at the edges: (alpha / 2) ** (1 / n) and its mirror
    edge = 0.025 ** (1 / trials)
    assert clopper_pearson(0, trials) == pytest.approx((0.0, 1 - edge), rel=1e-9)
    assert clopper_pearson(trials, trials) == pytest.approx((edge, 1.0), rel=1e-9)
    assert clopper_pearson(0, trials)[0] == 0.0 and clopper_pearson(trials, trials)[1] == 1.0


@pytest.mark.parametrize(("args", "match"), [
    ((5, 4), "successes = 5 exceeds trials = 4"),
    ((-1, 4), "successes must be an integer >= 0"),
    ((1, 0), "trials must be a positive integer"),
    ((1.5, 4), "successes must be an integer >= 0"),
    ((1, 4, 1.0), r"confidence must be a number in \(0, 1\)"),
    ((1, 4, True), r"confidence must be a number in \(0, 1\)"),
])
def test_clopper_pearson_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        clopper_pearson(*args)


# ---------------------------------------------------------------- duplicates


def test_duplicates_counts_against_pairwise_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20, 6, generator=g)
    x = torch.cat([x, x[3:5], 2 * x[7:8], -x[9:10], x[10:11] + 1e-3, torch.zeros(2, 6),
                   torch.full((1, 6), -0.0)])  # 2 exact + 2 parallel + 1 close + 3 zeros (one is -0.0)
    res = duplicates(x, cosine=0.9999)
    v = x.double().numpy()
    norms = np.linalg.norm(v, axis=1)
    cos = [abs(v[i] @ v[j]) / (norms[i] * norms[j]) if norms[i] * norms[j] > 0 else 0.0
           for i, j in itertools.combinations(range(len(v)), 2)]
    distinct = len({tuple(r) for r in (v + 0.0).tolist()})
    assert isinstance(res, DuplicateCounts) and "\n" not in repr(res)
    assert res.to_dict() == dict(N=len(v), exact_duplicates=len(v) - distinct,
                                 near_duplicate_pairs=sum(c >= 0.9999 for c in cos), cosine=0.9999,
                                 coherence=pytest.approx(max(cos), abs=1e-14), zero_vectors=3)
    assert (res.exact_duplicates, res.near_duplicate_pairs) == (4, 5)  # zero vectors pair with nothing


def test_duplicates_bad_input():
    for bad in (0, 1, 1.5, True):
        with pytest.raises(ValueError, match=r"cosine must be a number in \(0, 1\)"):
            duplicates(torch.randn(4, 3), cosine=bad)
    assert math.isnan(duplicates(torch.randn(1, 3)).coherence)
