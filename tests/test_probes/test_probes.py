"""Known-answer tests for the probes library (rank, Kruskal rank, assumptions)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import shared_data, with_singular_values
from scipy import stats

import probes
from probes import fast


@pytest.fixture
def imagenet_dir():
    return shared_data("imagenet-sample")  # fails under CI when missing, skips otherwise


def generic(n: int, d: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)




# ---------------------------------------------------------------- numerical_rank


def test_numerical_rank_known_singular_values():
    a = torch.zeros(6, 5, dtype=torch.float64)
    a[[0, 1, 2, 3], [3, 1, 4, 0]] = torch.tensor([3.0, 2.0, 1e-3, 1e-20], dtype=torch.float64)
    res = probes.numerical_rank(a)  # float64 tolerance: 3 * 6 * 2.2e-16
    assert int(res.rank) == 3
    assert float(res.tol) == pytest.approx(3.0 * 6 * torch.finfo(torch.float64).eps)
    expected = min(math.log10(1e-3 / float(res.tol)), math.log10(float(res.tol) / 1e-20))
    # the SVD of a scaled permutation is relatively accurate: each sigma to O(n^2 eps) (Demmel-Kahan), so
    # each log10 moves by n^2 eps / ln 10 decades and the margin (a difference of two) by twice that
    n, eps = 5, torch.finfo(torch.float64).eps
    assert float(res.margin) == pytest.approx(expected, rel=0, abs=2 * n**2 * eps / math.log(10))
    # judged at float32 tolerance (3 * 6 * 1.2e-7 = 2.1e-6) the 1e-3 value still counts
    assert int(probes.numerical_rank(a, source_dtype=torch.float32).rank) == 3
    assert int(probes.numerical_rank(a, rtol=1e-3).rank) == 2


def test_numerical_rank_batched_and_dtype_rule():
    batch = torch.stack(
        [with_singular_values([1.0, 1.0, 1e-9][:r] + [0.0] * (3 - r), 4, 3, seed=r) for r in (1, 2, 3)]
    )
    res = probes.numerical_rank(batch)
    assert res.rank.tolist() == [1, 2, 3]
    assert res.rank.shape == (3,)
    # the same numbers produced in float32 are judged at float32 tolerance: 1e-9 no longer counts
    assert probes.numerical_rank(batch, source_dtype=torch.float32).rank.tolist() == [1, 2, 2]
    zero = probes.numerical_rank(torch.zeros(3, 3))
    assert int(zero.rank) == 0 and math.isinf(float(zero.margin))


def test_numerical_rank_accepts_numpy_and_matches_torch_default():
    a = np.random.default_rng(0).standard_normal((20, 30)).astype(np.float32)
    a[:, 5] = a[:, 0] + a[:, 1]
    assert int(probes.numerical_rank(a).rank) == int(torch.linalg.matrix_rank(torch.from_numpy(a)))


# ---------------------------------------------------------------- Kruskal rank: known answers


def test_duplicates_have_kruskal_rank_one():
    x = generic(6, 5)
    x = torch.cat([x, x[2:3]])  # vector 6 duplicates vector 2
    assert probes.kruskal_rank_exact(x) == 1
    res = probes.kruskal_test(x, 2, subsets=1000)
    assert res.exhaustive and res.subsets == math.comb(7, 2)
    assert res.full_rank == res.subsets - 1 and res.witness == (2, 6)
    assert probes.check_witness(x, res.witness)


def test_zero_vector_gives_kruskal_rank_zero():
    x = generic(5, 4)
    x[3] = 0
    assert probes.kruskal_rank_exact(x) == 0


@pytest.mark.parametrize("s", [2, 3, 4, 5])
def test_s_vectors_spanning_s_minus_one_dimensions(s):
    d = 8
    basis = generic(s - 1, d, seed=1)
    dependent = generic(s, s - 1, seed=2) @ basis  # s vectors in an (s-1)-dim subspace
    x = torch.cat([generic(4, d, seed=3), dependent])
    assert probes.kruskal_rank_exact(x) == s - 1
    res = probes.kruskal_test(x, s, subsets=10**6)  # exhaustive: exactly one dependent subset
    assert res.exhaustive and res.subsets - res.full_rank == 1
    assert res.witness == tuple(range(4, 4 + s))
    assert res.rank_counts[s - 1] == 1


def test_generic_vectors_are_in_general_position():
    x = generic(9, 5, seed=4)
    assert probes.kruskal_rank_exact(x) == 5
    gp = probes.general_position(x)
    assert gp.share_meets_threshold and gp.fraction == 1.0 and gp.k == 5 and gp.exhaustive


def _brute_force_kruskal(x: torch.Tensor) -> int:
    n, d = x.shape
    best = 0
    for k in range(1, min(n, d) + 1):
        for idx in itertools.combinations(range(n), k):
            if int(probes.numerical_rank(x[list(idx)]).rank) < k:
                return best
        best = k
    return best


@pytest.mark.parametrize("seed", range(6))
def test_exact_search_matches_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    n, d = 7, 4
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    # plant a random dependency of random size among random vectors
    size = int(torch.randint(2, d + 1, (1,), generator=g))
    rows = torch.randperm(n, generator=g)[:size]
    coef = torch.randn(size - 1, generator=g, dtype=torch.float64)
    x[rows[-1]] = coef @ x[rows[:-1]]
    assert probes.kruskal_rank_exact(x) == _brute_force_kruskal(x)


def test_exact_search_refuses_large_problems():
    with pytest.raises(ValueError, match="kruskal_sweep"):
        probes.kruskal_rank_exact(generic(200, 50), max_subsets=10_000)


def test_sampled_fraction_matches_hypergeometric_law():
    """Pool: m vectors in an r-dim subspace plus generic ones. A k-subset is independent iff it holds
    at most r cluster vectors, so the full-rank probability is a hypergeometric CDF."""
    big_n, m, r, d, k, count = 60, 20, 3, 30, 8, 4000
    cluster = generic(m, r, seed=5) @ generic(r, d, seed=6)
    x = torch.cat([cluster, generic(big_n - m, d, seed=7)])
    p = stats.hypergeom(big_n, m, k).cdf(r)
    res = probes.kruskal_test(x, k, subsets=count, seed=11)
    lo, hi = stats.binom(count, p).interval(0.9999)
    assert lo <= res.full_rank <= hi, (res.full_rank, count * p)
    # the dependent subsets hold exactly rank = r + (generic members), never less
    assert res.witness is not None and probes.check_witness(x, res.witness)


def test_sampling_is_seeded_and_reproducible():
    x = generic(40, 6)
    a = probes.sample_subsets(40, 6, 100, seed=3)
    assert torch.equal(a, probes.sample_subsets(40, 6, 100, seed=3))
    assert not torch.equal(a, probes.sample_subsets(40, 6, 100, seed=4))
    assert (a[:, 1:] > a[:, :-1]).all()  # sorted, distinct indices
    assert probes.kruskal_test(x, 6, subsets=100, seed=3).to_dict() | {"seconds": 0} == probes.kruskal_test(
        x, 6, subsets=100, seed=3
    ).to_dict() | {"seconds": 0}


# ---------------------------------------------------------------- tolerance behaviour


def test_nearly_dependent_vectors_depend_on_the_tolerance():
    x = generic(6, 10, seed=8)
    x[5] = x[:5].sum(0) + 1e-9 * x[5].norm() * generic(1, 10, seed=9)[0]  # dependent up to 1e-9
    assert probes.kruskal_test(x, 6).fraction == 1.0  # float64 tolerance: independent
    f32 = probes.default_rtol(6, 10, torch.float32)
    res = probes.kruskal_test(x, 6, rtol=f32)
    assert res.fraction == 0.0 and res.witness == tuple(range(6))
    # float32 data is judged at float32 tolerance by default
    assert probes.kruskal_test(x.float(), 6).fraction == 0.0


# ---------------------------------------------------------------- fast path == SVD reference


def _reference_ranks(x: torch.Tensor, subsets: torch.Tensor, rtol: float) -> list[int]:
    return [int(probes.numerical_rank(x[s], rtol).rank) for s in subsets]


@pytest.mark.parametrize(
    ("dtype", "factors"),
    [
        (torch.float32, [1e6, 10.0, 1.5, 1.01, 0.99, 0.5, 1e-3, 0.0]),
        # at float64 tolerance the construction itself perturbs sigma_k by ~10%: stay clear of 1
        (torch.float64, [1e6, 10.0, 3.0, 2.0, 0.5, 0.3, 1e-3, 0.0]),
    ],
)
def test_fast_path_equals_svd_on_near_threshold_matrices(dtype, factors):
    """Matrices whose smallest singular value sits just above or just below the threshold."""
    k, d = 6, 9
    rtol = max(k, d) * torch.finfo(dtype).eps
    mats = torch.stack([with_singular_values([1.0] * (k - 1) + [f * rtol], k, d, seed=i)
                        for i, f in enumerate(factors)])
    dec = fast.matrix_decisions(mats, rtol)
    ref = probes.numerical_rank(mats, rtol).rank
    assert dec.rank.tolist() == ref.tolist()
    assert dec.rank.tolist() == [k] * 4 + [k - 1] * 4
    assert dec.stages["svd"] > 0 if dtype == torch.float64 else True  # below Gram resolution: exact SVD


def test_fast_path_equals_svd_on_random_subsets():
    x = torch.cat([generic(30, 12, seed=10), generic(10, 3, seed=11) @ generic(3, 12, seed=12)]).float()
    subsets = probes.sample_subsets(40, 7, 300, seed=0)
    rtol = probes.default_rtol(7, 12, torch.float32)
    dec = fast.subset_decisions(x.double(), subsets, rtol, None)
    assert dec.rank.tolist() == _reference_ranks(x, subsets, rtol)
    assert dec.stages["eigvalsh"] + dec.stages["svd"] > 0  # dependent subsets exercised stage 2


def test_fast_path_equals_svd_on_real_image_patches(imagenet_dir):
    """Real data: 16x16 RGB patches of a photograph (strongly correlated, low effective rank)."""
    from PIL import Image

    path = sorted(imagenet_dir.glob("*.JPEG"))[0]
    img = torch.from_numpy(np.array(Image.open(path).convert("RGB").resize((224, 224)))).float() / 255
    patches = img.unfold(0, 16, 16).unfold(1, 16, 16).reshape(-1, 3 * 16 * 16)  # (196, 768)
    for k in (5, 40):
        subsets = probes.sample_subsets(patches.shape[0], k, 60, seed=k)
        rtol = probes.default_rtol(k, 768, torch.float32)
        dec = fast.subset_decisions(patches.double(), subsets, rtol, patches.double() @ patches.double().T)
        assert dec.rank.tolist() == _reference_ranks(patches, subsets, rtol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    x = torch.cat([generic(200, 64, seed=13), generic(50, 8, seed=14) @ generic(8, 64, seed=15)]).float()
    cpu = probes.kruskal_test(x, 20, subsets=500)
    gpu = probes.kruskal_test(x.cuda(), 20, subsets=500)
    assert gpu.device.startswith("cuda")
    assert (cpu.full_rank, cpu.rank_counts, cpu.witness) == (gpu.full_rank, gpu.rank_counts, gpu.witness)


# ---------------------------------------------------------------- sweep and assumptions


def test_kruskal_sweep_bounds():
    cluster = generic(10, 3, seed=18) @ generic(3, 10, seed=16)  # 10 vectors in 3 dims: Kruskal rank 3
    x = torch.cat([generic(15, 10, seed=17), cluster])
    sweep = probes.kruskal_sweep(x, [2, 3, 4, 5, 6, 8], subsets=3000, seed=1, refine=0)
    assert sweep.upper_bound == 3  # certified by a witness at k = 4
    assert sweep.lower_estimate == 3
    assert probes.check_witness(x, sweep.results[2].witness)
    frame = sweep.frame()
    assert list(frame["k"]) == [2, 3, 4, 5, 6, 8]
    assert frame["fraction"].is_monotonic_decreasing


def test_a_sweep_whose_first_k_fails_reports_an_upper_bound_never_a_zero():
    """Kruskal rank 3, smallest tested k = 5: no tested k passed, so the sampled rank is "< 5" and the
    lower estimate is unknown (None, an empty cell in sweep.csv), not 0."""
    cluster = generic(10, 3, seed=18) @ generic(3, 10, seed=16)
    x = torch.cat([generic(15, 10, seed=17), cluster])
    sweep = probes.kruskal_sweep(x, [5, 8], subsets=3000, seed=1, refine=0)
    assert sweep.lower_estimate is None and sweep.upper_bound == 4 and sweep.sampled == "< 5"
    assert "sampled < 5, lower_estimate=None, upper_bound=4" in repr(sweep)
    from auditor.audit.report.tables import kruskal_table

    curves = sweep.frame().assign(
        representation="block.0",
        weights="random",
        lower_estimate=sweep.lower_estimate,
        upper_bound=sweep.upper_bound,
    )
    row = kruskal_table(curves).iloc[0]
    assert row["sampled estimate"] == "< 5" and row["certified upper bound"] == 4
    refined = probes.kruskal_sweep(x, [5, 8], subsets=3000, seed=1, refine=6)  # bisects below 5
    assert (refined.lower_estimate, refined.upper_bound, refined.sampled) == (3, 3, ">= 3")


def test_sweep_refinement_bisects_to_the_kruskal_rank():
    """Kruskal rank 3 (10 of the vectors lie in 3 dimensions): a coarse sweep at k = 2 and 8 leaves a
    gap; bisection adds k = 5, 3, 4 and pins the estimate to 3 = the certified upper bound."""
    cluster = generic(10, 3, seed=18) @ generic(3, 10, seed=16)
    x = torch.cat([generic(15, 10, seed=17), cluster])
    coarse = probes.kruskal_sweep(x, [2, 8], subsets=3000, seed=1, refine=0)
    assert (coarse.lower_estimate, coarse.upper_bound) == (2, 7) and coarse.refined == ()
    fine = probes.kruskal_sweep(x, [2, 8], subsets=3000, seed=1, refine=6)
    assert fine.refined == (5, 3, 4)  # stops once the gap is 1, before using all 6
    assert (fine.lower_estimate, fine.upper_bound) == (3, 3)
    frame = fine.frame()
    assert frame["k"].tolist() == [2, 3, 4, 5, 8] and frame["refined"].tolist() == [
        False,
        True,
        True,
        True,
        False,
    ]
    with pytest.raises(ValueError, match="refine must be an integer >= 0"):
        probes.kruskal_sweep(x, [2, 8], refine=-1)


def test_identical_queries_fail_assumption1_and_assumption3_repairs_it():
    """The ViT embedding layer: every CLS query is the same vector."""
    n_ex, n, d = 40, 5, 16
    contexts = generic(n_ex * n, d, seed=19).reshape(n_ex, n, d)
    contexts[:, 0] = contexts[0, 0]  # identical CLS row in every example
    queries = contexts[:, 0]
    a1 = probes.assumption1(queries, n, subsets=500)
    assert not a1.share_meets_threshold and a1.fraction == 0.0 and a1.rank_counts == {1: 500}
    a2 = probes.assumption2(contexts)
    assert a2.share_meets_threshold and a2.fraction == 1.0 and a2.rank_counts == {n: n_ex}
    a3 = probes.assumption3(contexts, queries, n, subsets=500)
    assert a3.share_meets_threshold and a3.fraction == 1.0
    row = a3.to_dict()
    assert row["test"] == "assumption3" and row["k"] == n and row["N"] == n_ex


def test_assumption2_counts_rank_deficient_contexts():
    contexts = generic(12 * 4, 6, seed=20).reshape(12, 4, 6)
    contexts[3, 3] = contexts[3, 0] - 2 * contexts[3, 1]
    res = probes.assumption2(contexts)
    assert not res.share_meets_threshold and res.fraction == pytest.approx(11 / 12) and res.witness == (3,)
    assert res.rank_counts == {3: 1, 4: 11}
    assert probes.assumption2(contexts, threshold=0.9).share_meets_threshold
    assert probes.context_ranks(contexts).rank.tolist() == probes.numerical_rank(contexts).rank.tolist()


def test_threshold_controls_the_verdict():
    basis = generic(2, 8, seed=21)
    x = torch.cat([generic(30, 8, seed=22), generic(3, 2, seed=23) @ basis])
    res = probes.assumption1(x, 3, subsets=10**5)
    assert res.exhaustive and 0.99 < res.fraction < 1.0
    assert res.share_meets_threshold and res.statement == "refuted"  # (share meets 0.99; a witness refutes)
    assert not probes.assumption1(x, 3, subsets=10**5, threshold=1.0).share_meets_threshold


def test_impossible_sizes_are_reported_not_tested():
    x = generic(20, 4)
    res = probes.kruskal_test(x, 6)
    assert res.fraction == 0.0 and "k = 6 > d = 4" in res.note and res.subsets == 0
    assert not probes.assumption1(x, 6).share_meets_threshold
    a2 = probes.assumption2(generic(3 * 6, 4).reshape(3, 6, 4))
    assert not a2.share_meets_threshold and "n = 6 > d = 4" in a2.note and a2.rank_counts == {4: 3}


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: probes.kruskal_test(torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), 1), "NaN/Inf"),
        (lambda: probes.kruskal_test(torch.tensor([[1.0, float("inf")]]), 1), "NaN/Inf"),
        (lambda: probes.kruskal_test(generic(5, 3), 6), "exceeds the number of vectors"),
        (lambda: probes.kruskal_test(generic(5, 3), 0), "positive integer"),
        (lambda: probes.kruskal_test(generic(5, 3), -2), "positive integer"),
        (lambda: probes.kruskal_test(generic(5, 3), 2, subsets=0), "subsets must be"),
        (lambda: probes.kruskal_test(torch.zeros(0, 3), 1), "non-empty"),
        (lambda: probes.kruskal_test(torch.zeros(3), 1), r"shape \(N, d\)"),
        (lambda: probes.kruskal_test([[1.0]], 1), "torch.Tensor or numpy"),
        (lambda: probes.kruskal_test(generic(5, 3), 2, rtol=-1.0), "rtol"),
        (lambda: probes.kruskal_test(generic(5, 3), 2, rtol=float("nan")), "rtol"),
        (lambda: probes.numerical_rank(torch.zeros(4)), "needs a matrix"),
        (lambda: probes.numerical_rank(torch.zeros(0, 4)), "non-empty"),
        (lambda: probes.assumption2(generic(4, 3)), r"shape \(N, n, d\)"),
        (lambda: probes.assumption1(generic(5, 3), 2, threshold=1.5), "threshold"),
        (lambda: probes.assumption1(generic(5, 3), 0), "context length"),
        (lambda: probes.assumption3(generic(12, 3).reshape(4, 3, 3), generic(5, 3)), "do not match"),
    ],
)
def test_bad_input_is_a_one_line_value_error(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_low_rank_pool_is_settled_for_every_subset_at_once():
    """Tokens spanning 6 of 10 dimensions: every 8-subset is dependent, proven by interlacing."""
    x = (generic(40, 6, seed=24) @ generic(6, 10, seed=25)).float()
    res = probes.kruskal_test(x, 8, subsets=5000)
    assert res.fraction == 0.0 and "every 8-subset is dependent" in res.note
    # proven for every subset by the pool's spectrum, not enumerated: C(40, 8) subsets were never listed
    assert res.spectrum_proof and not res.exhaustive and res.subsets == 5000
    assert "every one proven dependent by the pool's spectrum" in repr(res) and "over all" not in repr(res)
    assert set(res.rank_counts) == {6} and sum(res.rank_counts.values()) == 100
    assert probes.check_witness(x, res.witness)
    gp = probes.general_position(x)
    assert not gp.share_meets_threshold and gp.k == 10


def test_certified_margins_never_exceed_the_exact_margins():
    x = torch.cat([generic(60, 20, seed=26), generic(20, 5, seed=27) @ generic(5, 20, seed=28)]).float()
    subsets = probes.sample_subsets(80, 12, 400, seed=2)
    rtol = probes.default_rtol(12, 20, torch.float32)
    dec = fast.subset_decisions(x.double(), subsets, rtol, None)
    exact = probes.numerical_rank(x.double()[subsets], rtol)  # (400,) batched SVD reference
    assert dec.rank.tolist() == exact.rank.tolist()
    certified = dec.rank == 12
    assert certified.any() and (~certified).any()
    assert (dec.margin[certified] <= exact.margin[certified] + 1e-9).all()
    assert (dec.margin[certified] > 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dependence_proof_never_contradicts_the_svd(dtype):
    """Stage 1b (a failing shifted Cholesky) may leave a matrix undecided but never calls a full-rank
    matrix dependent: smallest singular values straddle the threshold by factors down to 1.01."""
    k, d = 8, 8
    rtol = max(k, d) * torch.finfo(dtype).eps
    factors = [1e3, 3.0, 1.5, 1.01, 0.99, 0.7, 0.3, 1e-2, 1e-4, 0.0]
    mats = torch.stack([with_singular_values([5.0] + [1.0] * (k - 2) + [f * 5.0 * rtol], k, d, seed=i)
                        for i, f in enumerate(factors)])
    gram = mats @ mats.transpose(1, 2)
    dec = fast.decide(gram, lambda pos: mats[pos], rtol, d, exact_dependent=0)
    ref = probes.numerical_rank(mats, rtol).rank
    proven = dec.rank == -1
    assert (ref[proven] < k).all()  # every proof is right
    assert ((dec.rank == ref) | proven).all()  # and everything else is exact
    if dtype == torch.float32:
        assert proven[-3:].all()  # clear cases (>= 2 decades below) are proven
    else:  # float64 tolerance is below the Gram's resolution: nothing to prove, the SVD decides
        assert not proven.any() and dec.stages["svd"] > 0
    assert dec.stages["cholesky_dependent"] == int(proven.sum())


def test_kruskal_test_with_proven_dependent_subsets_keeps_the_verdicts():
    """A full-rank pool whose k = d subsets are often dependent (general position at k = d): the
    dependence proof gives the same fraction and witness as exact ranks for every subset, and the rank
    histogram covers only the subsets that got an exact rank."""
    x = torch.cat([generic(14, 10, seed=30), generic(12, 4, seed=31) @ generic(4, 10, seed=32)]).float()
    exact = probes.kruskal_test(x, 10, subsets=400, seed=3, rank_sample=None)
    fast = probes.kruskal_test(x, 10, subsets=400, seed=3, rank_sample=5)
    assert 0.0 < exact.fraction < 1.0 and exact.fraction == fast.fraction
    assert exact.witness == fast.witness and probes.check_witness(x, fast.witness)
    assert fast.stages["cholesky_dependent"] > 5
    assert sum(fast.rank_counts.values()) == fast.full_rank + 5
    assert sum(exact.rank_counts.values()) == 400 and exact.stages["cholesky_dependent"] == 0
    assert "proven dependent" in fast.note and fast.subsets == 400 and not fast.exhaustive
    gp = probes.general_position(x, subsets=400, seed=3, threshold=0.5)
    assert gp.fraction == exact.fraction and gp.share_meets_threshold == (exact.fraction >= 0.5)
