"""The fast subset path of probes (probes.fast): float32 certificates, the margin floor and threads.

Every fast decision must be a proof: a float32 certificate never accepts a subset that the float64 SVD
calls dependent at the same tolerance (nor credits it with more margin than it has), and ranks,
verdicts, witnesses and rank histograms equal those of the plain float64 pipeline, for any number of
threads and any chunking.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import threadpoolctl
import torch
from conftest import with_singular_values

import probes
from probes import fast


def generic(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)




def blocks_pool(blocks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack k x d blocks into one pool; subset i is block i."""
    k = blocks[0].shape[0]
    x = torch.cat(blocks)
    subsets = torch.arange(x.shape[0]).reshape(len(blocks), k)
    return x, subsets


def route_atol(gram: torch.Tensor, x: torch.Tensor, ceiling: torch.Tensor, *, rows: bool) -> torch.Tensor:
    """(t,) how far the ceilings of the two routes (batched, matrix by matrix) may differ, from the error
    bounds of the operations both compute: each route's Rayleigh bound carries the rounding term
    R = (2 (k + 1) + 2 d) u 1.01 trace(G) of ``rayleigh_up`` on top of the exact v^T G v / |v|^2; the two
    refined vectors differ by their rounding, |dv| / |v| <= eta = 8 k eps kappa (kappa the largest
    condition number of a leading block of G, any of which may be the one solved with), which moves the
    exact Rayleigh quotient by at most 2 sqrt(lambda_max c^2 lam_lo) eta + lambda_max eta^2; lam_lo
    (two power steps) agrees between routes to 8 k eps relative. The rows' bound (``rows``) adds the
    rounding 2.04 m u sqrt(m) max|x_i| of fl(X^T v) and the product's own change sqrt(lambda_max) eta,
    both on sigma, not sigma^2. ``gram`` (t, k, k), ``x`` (t, k, d) the rows, ``ceiling`` (t,)."""
    eps, (k, d) = torch.finfo(torch.float64).eps, x.shape[-2:]
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    lam_max = torch.linalg.eigvalsh(gram)[:, -1]
    lam_lo = fast.kernels.power_lower(gram, steps=2)
    leading = [torch.linalg.eigvalsh(gram[:, :j, :j]) for j in range(1, k)]  # each (t, j)
    kappa = torch.stack([e[:, -1] / e[:, 0].clamp(min=1e-300) for e in leading]).amax(0)  # (t,)
    eta = (8 * k * eps * kappa).clamp(max=1.0)
    rounding = (2 * (k + 1) + 2 * d) * (eps / 2) * 1.01 * trace
    moved = 2 * torch.sqrt(lam_max * ceiling**2 * lam_lo) * eta + lam_max * eta**2
    squares = (2 * rounding + moved) / lam_lo + ceiling**2 * 8 * k * eps  # |c_a^2 - c_b^2|
    atol = squares / ceiling.clamp(min=1e-300)  # (>= |c_a - c_b|, since c_a + c_b >= the smaller ceiling)
    if rows:
        norms = torch.linalg.vector_norm(x, dim=-1).amax(-1)
        atol = torch.maximum(atol, (2 * 2.04 * k * (eps / 2) * math.sqrt(k) * norms
                                    + torch.sqrt(lam_max) * eta) / torch.sqrt(lam_lo))
    return atol


def tune(patch, **changes) -> None:
    """Replace fields of the fast path's tuning for one test (``patch``: monkeypatch or its context)."""
    patch.setattr(fast.tuning, "TUNING", dataclasses.replace(fast.tuning.TUNING, **changes))


def reference(x: torch.Tensor, subsets: torch.Tensor, rtol: float) -> probes.RankResult:
    return probes.numerical_rank(x[subsets], rtol)  # float64 SVD of every subset


def pool_of(x: torch.Tensor, k: int, rtol: float) -> fast.Pool:
    cap = float(torch.linalg.svdvals(x)[0]) ** 2
    return fast.Pool(x, x @ x.T, k, rtol, cap, step=64)


def cluster_pool(n: int, d: int, r: int, seed: int) -> torch.Tensor:
    """Half the vectors in an r-dimensional subspace: subsets holding more than r of them are dependent."""
    x = generic(n, d, seed)
    x[: n // 2] = generic(n // 2, r, seed + 1) @ generic(r, d, seed + 2)
    return x.float().double()


# ------------------------------------------------------------------ stage 0: float32 certificates


FACTORS = [0.5, 0.7, 0.9, 0.99, 0.999, 1.0, 1.001, 1.01, 1.1, 1.3, 1.5, 2.0]


@pytest.mark.parametrize("rtol", [0.05, 6e-4])
@pytest.mark.parametrize("floor", [0.0, 0.05, 0.2])
def test_float32_certificate_never_accepts_near_dependent_subsets(rtol, floor):
    """sigma_k within a factor 2 of the tolerance on both sides; each subset alone in its pool, so the
    pool's sigma_1 caps lambda_max exactly and nothing but the float32 error bound separates the shift
    from the tolerance. At rtol = 6e-4, tol^2 is at the level of float32 rounding: a certificate that
    ignored rounding would accept some of the subsets at or below the threshold. A certificate at a
    floor m must imply full rank and a margin >= m by the float64 SVD; at rtol = 0.05, where float32
    resolves the threshold, clear cases are certified."""
    k, d = 6, 9
    ok, ref = [], []
    for i, f in enumerate(FACTORS):
        sigma_max = 2.0 ** (i - 6)  # scales from 2^-6 to 2^5
        x = with_singular_values(
            [sigma_max] + [0.5 * sigma_max] * (k - 2) + [f * rtol * sigma_max], k, d, seed=i
        )
        subsets = torch.arange(k)[None]
        ok.append(bool(pool_of(x, k, rtol).certify32(subsets, floor)))
        ref.append(reference(x, subsets, rtol))
    for certified, r in zip(ok, ref, strict=True):
        if certified:
            assert int(r.rank) == k and float(r.margin) >= floor
    if rtol == 0.05:
        certified = {f for f, c in zip(FACTORS, ok, strict=True) if c}
        assert {1.5, 2.0} <= certified if floor < 0.1 else 2.0 in certified


def test_float32_certificate_is_sound_under_adversarial_scaling():
    """Rows scaled by powers of two up to 2^-20 .. 2^20 (float32 rounding of the Gram is then far from
    uniform), near-dependent rows within 2x of the tolerance, and duplicated rows: every float32
    certificate is confirmed by the float64 SVD, at float32 tolerance and at a coarse one."""
    k, d = 8, 12
    g = torch.Generator().manual_seed(7)
    blocks = []
    for i in range(60):
        b = generic(k, d, seed=100 + i)
        if i % 3 == 1:  # last row a combination of the others, off by a relative 0.5 .. 2 x rtol
            b[-1] = b[:-1].T @ torch.randn(k - 1, generator=g, dtype=torch.float64)
            b[-1] += (0.5 + 1.5 * i / 60) * 1e-4 * b[-1].norm() * generic(1, d, seed=200 + i)[0]
        if i % 3 == 2:
            b[-1] = b[0]
        wide = 20 if i % 2 else 3
        scale = 2.0 ** torch.randint(-wide, wide + 1, (k, 1), generator=g).double()
        blocks.append(b * scale)
    x, subsets = blocks_pool(blocks)
    for rtol in (probes.default_rtol(k, d, torch.float32), 1e-4, 3e-4):
        ok = pool_of(x, k, rtol).certify32(subsets, 0.0)
        ref = reference(x, subsets, rtol)
        assert (ref.rank[ok] == k).all(), rtol
        assert ok.any()


def test_float32_certificate_defers_at_float32_tolerance():
    """At float32 tolerance a near-threshold subset is below float32's own rounding: stage 0 leaves it
    to float64, and the whole path still gives the SVD's ranks."""
    k, d = 6, 9
    rtol = probes.default_rtol(k, d, torch.float32)
    blocks = [with_singular_values([1.0] * (k - 1) + [f * rtol], k, d, seed=i) for i, f in enumerate(FACTORS)]
    x, subsets = blocks_pool(blocks)
    assert not pool_of(x, k, rtol).certify32(subsets, 0.0).any()
    dec = fast.subset_decisions(x, subsets, rtol, x @ x.T)
    assert dec.rank.tolist() == reference(x, subsets, rtol).rank.tolist()


# ------------------------------------------------------------------ the whole path against float64


def single_chunk(x, subsets, rtol, cap, exact_dependent, monkeypatch):
    """The plain float64 pipeline (no float32, no floor, no stage 1b shortcut) on all subsets at once."""
    gram = (x @ x.T)[subsets[:, :, None], subsets[:, None, :]]
    with monkeypatch.context() as m:
        m.setattr(
            fast.stages,
            "quick_dependent",
            lambda *args, **kwargs: (
                torch.zeros_like(args[6]),
                torch.ones(args[6].shape, dtype=torch.float64),
            ),
        )
        first = torch.arange(subsets.shape[0]) < (exact_dependent or 0)
        return fast.decide(gram, lambda pos: x[subsets[pos]], rtol, x.shape[1], lam_cap=cap,
                            exact_dependent=exact_dependent, exact_first=first)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few subsets, so that small tests run many chunks (floor, plans, threads)."""
    tune(monkeypatch, cache_bytes=8 * 12 * 12 * 7)


@pytest.mark.parametrize("kind", ["generic", "cluster"])
@pytest.mark.parametrize("exact_dependent", [None, 0, 5])
def test_fast_path_equals_the_float64_pipeline(kind, exact_dependent, small_chunks, monkeypatch):
    """Same ranks (so the same verdicts, witnesses and histograms) and the same stage 1b proofs as the
    plain float64 pipeline, whether stage 0, the margin floor or the stage 1b shortcut decided."""
    n, d, k, count = 60, 16, 12, 400
    x = generic(n, d, seed=1).float().double() if kind == "generic" else cluster_pool(n, d, 6, seed=2)
    rtol = probes.default_rtol(k, d, torch.float32)
    cap = float(torch.linalg.svdvals(x)[0]) ** 2
    subsets = probes.sample_subsets(n, k, count, seed=3)
    dec = fast.subset_decisions(x, subsets, rtol, x @ x.T, lam_cap=cap, exact_dependent=exact_dependent)
    plain = single_chunk(x, subsets, rtol, cap, exact_dependent, monkeypatch)
    assert dec.rank.tolist() == plain.rank.tolist()
    assert dec.stages["cholesky_dependent"] == plain.stages["cholesky_dependent"]
    others = ("cholesky", "cholesky32", "eigvalsh", "svd")
    assert sum(dec.stages[key] for key in others) == sum(plain.stages[key] for key in others)
    if kind == "generic":
        assert dec.stages["cholesky32"] > count // 2  # stage 0 did the work
    elif exact_dependent is not None:
        assert dec.shortcut > dec.stages["cholesky_dependent"] // 2  # the shortcut did most proofs
    ref = reference(x, subsets, rtol)
    known = dec.rank >= 0
    assert (dec.rank[known] == ref.rank[known]).all()
    assert (ref.rank[~known] < k).all()
    # certified margins are proven lower bounds; the minimum is at least the plain pipeline's bound
    full = dec.rank == k
    assert (dec.margin[full] <= ref.margin[full] + 1e-9).all()
    if bool(full.any()):
        assert float(dec.margin[full].min()) >= float(plain.margin[plain.rank == k].min()) - 1e-12
    # a dependent subset's margin is exact where its eigenvalues resolve it, else a proven lower bound
    dependent = known & ~full
    bound = dependent & dec.bound
    assert (dec.margin[bound] <= ref.margin[bound] + 1e-9).all()
    exact = dependent & ~dec.bound
    # (an exact margin's deciding singular values are resolved to RESOLVED, relative, by their eigenvalues)
    resolved = 2 * math.log10(1 + 2 * fast.stages.RESOLVED)
    assert torch.allclose(dec.margin[exact], ref.margin[exact], rtol=0, atol=resolved)


def test_threads_and_chunking_do_not_change_anything(small_chunks):
    n, d, k = 60, 16, 12
    x = cluster_pool(n, d, 6, seed=4)
    rtol = probes.default_rtol(k, d, torch.float32)
    subsets = probes.sample_subsets(n, k, 500, seed=5)
    threads = torch.get_num_threads()
    runs = [
        fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=20, workers=w) for w in (1, 2, 3, 2)
    ]
    assert torch.get_num_threads() == threads
    for other in runs[1:]:
        assert torch.equal(runs[0].rank, other.rank)
        # margins: the same verdicts, floats within float32 rounding (the chunks, hence the batched
        # kernels' batch sizes, differ between worker counts)
        torch.testing.assert_close(other.margin.nan_to_num(-1.0), runs[0].margin.nan_to_num(-1.0), rtol=0,
                                   atol=k * torch.finfo(torch.float32).eps)
        assert runs[0].stages == other.stages


def test_the_histogram_holds_the_first_dependent_subsets_with_their_svd_ranks(small_chunks):
    """exact_dependent = m: the first m dependent subsets in subset order carry exact ranks (those in
    subsets 0 .. m-1 without a dependence proof first), equal to the float64 SVD's."""
    n, d, k, m = 60, 16, 12, 20
    x = cluster_pool(n, d, 6, seed=4)
    rtol = probes.default_rtol(k, d, torch.float32)
    subsets = probes.sample_subsets(n, k, 500, seed=5)
    dec = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=m, workers=2)
    ref = reference(x, subsets, rtol)
    first = (ref.rank < k).nonzero().flatten()[:m]
    assert first.numel() == m and (dec.rank[first] >= 0).all()
    assert torch.equal(dec.rank[first], ref.rank[first])
    assert dec.stages["cholesky_dependent"] < int((ref.rank < k).sum())  # the first ones were not proven


def test_progress_counts_every_subset_once(small_chunks):
    x = generic(40, 16, seed=6)
    subsets = probes.sample_subsets(40, 12, 300, seed=7)
    seen = []
    fast.subset_decisions(x, subsets, 1e-6, x @ x.T, on_chunk=seen.append, workers=2)
    assert sum(seen) == 300 and all(c > 0 for c in seen)


def test_an_error_in_a_worker_reaches_the_caller(small_chunks, monkeypatch):
    x = generic(40, 16, seed=8)
    subsets = probes.sample_subsets(40, 12, 300, seed=9)
    real = fast.subsets.decide_chunk
    calls = []

    def failing(*args):
        calls.append(1)
        if len(calls) == 30:
            raise RuntimeError("boom")
        return real(*args)

    monkeypatch.setattr(fast.subsets, "decide_chunk", failing)
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"):
        fast.subset_decisions(x, subsets, 1e-6, x @ x.T, workers=2)
    assert torch.get_num_threads() == threads


def test_without_pool_gram_and_kruskal_test_keep_the_verdicts(small_chunks, monkeypatch):
    n, d, k = 50, 14, 10
    x = cluster_pool(n, d, 5, seed=10)
    rtol = probes.default_rtol(k, d, torch.float32)
    subsets = probes.sample_subsets(n, k, 300, seed=11)
    with_gram = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=4)
    without = fast.subset_decisions(x, subsets, rtol, None, exact_dependent=4)
    assert with_gram.rank.tolist() == without.rank.tolist()
    res = probes.kruskal_test(x.float(), k, subsets=300, seed=11, rank_sample=4)
    plain = single_chunk(x, subsets, rtol, float(torch.linalg.svdvals(x)[0]) ** 2, 4, monkeypatch)
    full = plain.rank == k
    assert res.full_rank == int(full.sum())
    assert res.witness == tuple(subsets[int((~full).nonzero()[0])].tolist())
    ranks = plain.rank[plain.rank >= 0].tolist()
    assert res.rank_counts == {r: ranks.count(r) for r in sorted(set(ranks))}
    assert math.isfinite(res.min_margin)


# ------------------------------------------------------------------ ceilings and reach (for probes.robust)


ROUTES = {"batched": 10**9, "per-matrix": 1}  # Tuning.ceiling_loop_k for the two routes of the ceilings


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("stage_1b", [False, True, "0b"])
@pytest.mark.parametrize("noise", [0.0, 1e-9, 1e-6, 1e-4])
def test_ceilings_of_dependent_subsets_are_never_below_the_svd_ratio(
    noise, stage_1b, route, small_chunks, monkeypatch
):
    """Every ceiling is a proven upper bound on sigma_k / sigma_1 (float64 SVD), for subsets dependent
    exactly (float32-rounded subspace) or only near the tolerance; exact dependence gets ceilings far
    below rtol, which is what spares the robustness grid its smallest tolerances. ``stage_1b``: stage
    1b proper gives ceilings too (as it does from k = 384 on); "0b": stage 0b on the leading rows
    forced on (its ceilings bound lambda_max below by the largest diagonal entry). ``route``: the
    ceilings' kernels batched or matrix by matrix (``Tuning.ceiling_loop_k``)."""
    tune(monkeypatch, ceiling_loop_k=ROUTES[route])
    settled_0b = []
    if stage_1b == "0b":
        tune(monkeypatch, lead_pad=1)
        tune(monkeypatch, lead_share=1.0)
        original = fast.Pool.dependent_lead

        def counted(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            settled_0b.append(int(out[0].sum()))
            return out

        monkeypatch.setattr(fast.Pool, "dependent_lead", counted)
    elif stage_1b:
        tune(monkeypatch, ceil_1b_k=1)
    x = cluster_pool(60, 24, 6, seed=11)
    g = torch.Generator().manual_seed(12)
    x[:30] += noise * torch.randn(30, 24, generator=g, dtype=torch.float64) * x[:30].norm(dim=1, keepdim=True)
    k, rtol = 12, 1e-4
    subsets = probes.sample_subsets(60, k, 400, seed=13)
    dec = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=0, ceilings=True, workers=2)
    sv = torch.linalg.svdvals(x[subsets])
    ratio = sv[:, -1] / sv[:, 0]
    proven = dec.rank == -1
    assert proven.sum() > 20
    assert torch.all(dec.ceiling[proven] >= ratio[proven] * (1 - 1e-9))
    # elsewhere: none, except for subsets decided from exact spectra (a ceiling from those)
    # (spectra: a margin exact or, where they do not resolve it, a bound; dependent, or with a floor)
    exact = (dec.rank >= 0) & (~dec.bound | (dec.rank < k) | (dec.floor > 0))
    assert torch.all(torch.isinf(dec.ceiling[~proven & ~exact]))
    if stage_1b is True:
        assert torch.isfinite(dec.ceiling[proven]).all()
    if stage_1b == "0b" and noise < 1e-4:
        assert sum(settled_0b) > 20  # stage 0b proved many of them
    assert torch.all(dec.ceiling[exact] >= ratio[exact] * (1 - 1e-9))
    # the exact spectra also give proven floors (0 elsewhere)
    assert torch.all(dec.floor <= ratio * (1 + 1e-9)) and torch.all(dec.floor[~exact] == 0)
    assert torch.all(dec.floor[exact] >= ratio[exact] * (1 - 1e-6) - 1e-7)
    known = proven & torch.isfinite(dec.ceiling)
    assert torch.all(dec.ceiling[known] <= 1.0)
    if noise == 0.0:  # exact dependence: the stage 1b shortcut settles most, with ceilings
        assert (dec.ceiling[proven] < 0.1 * rtol).double().mean() > 0.75  # (the shortcut settles most)
    plain = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=0, workers=2)
    assert plain.ceiling is None and torch.equal(plain.rank, dec.rank)


def test_histogram_subsets_get_ceilings_from_their_exact_spectra(small_chunks):
    """The dependent subsets given exact ranks for the histogram keep a proven ceiling (from their
    spectra) instead of losing it: never below the float64 SVD ratio, and far below rtol where the
    dependence is exact."""
    x = cluster_pool(60, 24, 6, seed=11)
    k, rtol = 12, 1e-4
    subsets = probes.sample_subsets(60, k, 400, seed=13)
    dec = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=8, ceilings=True, workers=2)
    sv = torch.linalg.svdvals(x[subsets])
    ratio = sv[:, -1] / sv[:, 0]
    histogram = (dec.rank >= 0) & (dec.rank < k)  # (exact ranks: from their spectra)
    assert histogram.sum() >= 8
    assert torch.all(dec.ceiling[histogram] >= ratio[histogram] * (1 - 1e-9))
    assert torch.all(dec.ceiling[histogram] < 0.1 * rtol)


# ------------------------------------------------------------------ stage 0b: proofs from the leading rows


def near_dependent_leads(k: int, d: int, lead: int, factors, seed: int) -> torch.Tensor:
    """k x d blocks whose row ``lead - 1`` is a combination of the rows before it, off by ``f`` times
    the tolerance scale (f = 0: exactly dependent in float64 up to rounding); the other rows generic,
    some scaled by powers of two."""
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for i, f in enumerate(factors):
        b = generic(k, d, seed=seed + i)
        b[lead - 1] = b[: lead - 1].T @ torch.randn(lead - 1, generator=g, dtype=torch.float64)
        b[lead - 1] += f * b[lead - 1].norm() * generic(1, d, seed=seed + 1000 + i)[0]
        b[lead:] *= 2.0 ** torch.randint(-3, 4, (k - lead, 1), generator=g).double()
        blocks.append(b)
    return torch.stack(blocks)


@pytest.mark.parametrize("rtol", [1e-3, 3e-5])
def test_stage_0b_proves_only_what_stage_1b_proves(rtol):
    """Near-dependent leading rows, the gap from 0.1x to 10x of the tolerance (and exact dependence):
    every subset stage 0b calls dependent, from its leading block alone, is one the stage 1b proof on
    the whole Gram matrix calls dependent, and the float64 SVD puts it below the tolerance; clear
    cases are proven."""
    k, d, lead = 10, 14, 6
    factors = [0.0] * 4 + [f * rtol for f in (0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.1, 1.5, 2.0, 3.0, 10.0)]
    x, subsets = blocks_pool(list(near_dependent_leads(k, d, lead, factors, seed=11)))
    pool = pool_of(x, k, rtol)
    _, info32, gersh_up = pool.certify32(subsets, 0.0, detail=True)
    dep, at, ceiling = pool.dependent_lead(subsets, lead + 1, gersh_up, ceilings=True)
    dep_trace, _, _ = pool.dependent_lead(subsets, lead + 1)  # the bound from the trace alone
    gram = (x @ x.T)[subsets[:, :, None], subsets[:, None, :]]
    whole, _ = fast.prove_dependent(gram, fast.lam_hi_bound(gram, pool.lam_cap), rtol, d)
    ref = reference(x, subsets, rtol)
    for proven in (dep, dep_trace):
        assert not (proven & ~whole).any()
        assert (ref.rank[proven] < k).all()
    assert dep[:4].all() and dep_trace[:4].all()  # exact dependence is proven from the block
    assert (at[dep] <= lead + 1).all() and (at[dep] > 0).all()  # within the block
    sv = torch.linalg.svdvals(x[subsets])
    assert torch.all(ceiling[dep] >= (sv[:, -1] / sv[:, 0])[dep] * (1 - 1e-9))  # proven ceilings
    assert torch.all(ceiling[:4] < 0.1 * rtol)


def test_stage_0b_at_the_dip_exposes_the_exact_dependence_not_the_near_one():
    """A row nearly dependent at about 0.5 rtol comes before a row dependent up to rounding: at the
    usual shift the factorisation fails at the first and its vector bounds the ratio only by about
    rtol; at the dip's shift it fails at the second, whose null vector gives a ceiling far below the dip.
    Both prove the same subsets; every ceiling stays above the float64 SVD ratio."""
    k, d, lead, rtol = 10, 14, 8, 1e-3
    g = torch.Generator().manual_seed(21)
    blocks = []
    for i in range(6):
        b = generic(k, d, seed=40 + i)
        near = b[:3].T @ torch.randn(3, generator=g, dtype=torch.float64)
        b[3] = near + 0.5 * rtol * near.norm() * generic(1, d, seed=60 + i)[0]  # (nearly dependent)
        b[lead - 1] = b[: lead - 1].T @ torch.randn(lead - 1, generator=g, dtype=torch.float64)  # (exactly)
        blocks.append(b)
    x, subsets = blocks_pool(blocks)
    pool = pool_of(x, k, rtol)
    usual = pool.dependent_lead(subsets, lead + 1, ceilings=True)
    dipped = pool.dependent_lead(subsets, lead + 1, ceilings=True, dip=0.1)
    assert usual[0].all() and dipped[0].all()
    sv = torch.linalg.svdvals(x[subsets])
    ratio = sv[:, -1] / sv[:, 0]
    assert (usual[1] == 4).all() and (dipped[1] == lead).all()  # the pivots at which they failed
    assert (usual[2] > 0.1 * rtol).all()  # the near dependence's vector
    assert (dipped[2] < 0.01 * rtol).all() and (dipped[2] >= ratio * (1 - 1e-9)).all()
    assert torch.equal(pool.dependent_lead(subsets, lead + 1, dip=0.1)[2], torch.ones(6, dtype=torch.float64))


def test_stage_0b_leaves_subsets_whose_dependence_lies_beyond_the_block():
    k, d = 10, 14
    x, subsets = blocks_pool(list(near_dependent_leads(k, d, 9, [0.0] * 6, seed=12)))
    pool = pool_of(x, k, 1e-4)
    dep, at, _ = pool.dependent_lead(subsets, 5)
    assert not dep.any() and (at == 0).all()
    assert pool.dependent_lead(subsets, 9)[0].all()


@pytest.mark.parametrize("exact_dependent", [0, 5])
def test_stage_0b_changes_no_rank(exact_dependent, small_chunks, monkeypatch):
    """Stage 0b forced on (from float32 pivots and from the planner's leading size): the same ranks,
    margins and dependence proofs as without it, for any number of threads."""
    n, d, k = 60, 16, 12
    x = cluster_pool(n, d, 6, seed=13)
    rtol = probes.default_rtol(k, d, torch.float32)
    cap = float(torch.linalg.svdvals(x)[0]) ** 2
    subsets = probes.sample_subsets(n, k, 500, seed=14)

    def run(workers):
        return fast.subset_decisions(x, subsets, rtol, x @ x.T, lam_cap=cap, exact_dependent=exact_dependent,
                                      workers=workers)

    with monkeypatch.context() as m:
        tune(m, lead_share=0.0)  # stage 0b never runs
        off = run(1)
    calls = []
    original = fast.Pool.dependent_lead

    def counted(self, idx, size, gersh_up=None, ceilings=False, dip=None):
        out = original(self, idx, size, gersh_up, ceilings, dip=dip)
        calls.append((int(idx.shape[0]), int(out[0].sum()), gersh_up is None))
        return out

    monkeypatch.setattr(fast.Pool, "dependent_lead", counted)
    tune(monkeypatch, lead_pad=1)
    tune(monkeypatch, lead_share=1.0)
    runs = [run(w) for w in (1, 2)]
    assert sum(c[1] for c in calls if c[2]) > 50  # the planner's route settled many
    for on in runs:
        assert torch.equal(on.rank, off.rank)
        # (margins in decades from float64 factors and spectra: equal up to rounding, batch sizes differ)
        torch.testing.assert_close(on.margin, off.margin, rtol=0, atol=1e3 * torch.finfo(torch.float64).eps,
                                   equal_nan=True)
        assert on.stages["cholesky_dependent"] == off.stages["cholesky_dependent"]
    ref = reference(x, subsets, rtol)
    assert (ref.rank[runs[0].rank < 0] < k).all()


@pytest.mark.parametrize("rows", [False, True])
def test_stage_1b_ceilings_are_never_below_the_svd_ratio(rows, monkeypatch):
    """Batched and matrix by matrix (``Tuning.ceiling_loop_k``), with and without the rows' bound: the
    same proven ceilings up to the rounding of the refined vectors (:func:`route_atol`), never below the
    SVD ratio."""
    x, subsets = blocks_pool([with_singular_values([1.0, 0.4, 0.1, f], 4, 9, seed=i)
                              for i, f in enumerate([1e-3, 3e-4, 1e-6, 1e-9, 0.0, 5e-5])])
    gram = (x @ x.T)[subsets[:, :, None], subsets[:, None, :]]
    lam_hi = fast.lam_hi_bound(gram, None)
    sv = torch.linalg.svdvals(x[subsets])
    ratio = sv[:, -1] / sv[:, 0]
    ceilings = {}
    for route, loop_k in ROUTES.items():
        tune(monkeypatch, ceiling_loop_k=loop_k)
        dep, ceiling = fast.prove_dependent(gram, lam_hi, 1e-3, 9, ceilings=True,
                                            rows=(lambda p: x[subsets[p]]) if rows else None)
        assert dep.tolist() == [False, True, True, True, True, True]
        assert torch.all(ceiling[dep] >= ratio[dep] * (1 - 1e-9)) and torch.all(ceiling[dep] < 1e-3)
        assert ceiling[0] == 1.0  # (not proven: no ceiling)
        ceilings[route] = ceiling
    atol = route_atol(gram, x[subsets], torch.minimum(*ceilings.values()), rows=rows)
    assert torch.all((ceilings["per-matrix"] - ceilings["batched"]).abs() <= atol)
    if rows:  # exact dependence: the rows put it far below the Gram route's floor, on both routes
        assert torch.all(ceilings["per-matrix"][4] < 1e-7)
    assert fast.prove_dependent(gram, lam_hi, 1e-3, 9)[1] is None


@pytest.mark.parametrize("lead", [3, 8])
def test_ceilings_matrix_by_matrix_from_an_early_or_a_late_pivot(lead, monkeypatch):
    """Row ``lead`` nearly a combination of the rows before it, so the factorisation fails there: an
    early pivot (the leading block copied) or a late one (the factor itself, its trailing diagonal set
    to 1). Matrix by matrix, the ceilings equal the batched ones up to rounding and bound the SVD ratio."""
    k, d = 10, 15
    g = torch.Generator().manual_seed(41 + lead)
    x = torch.randn(4, k, d, generator=g, dtype=torch.float64)
    mix = torch.randn(4, 1, lead, generator=g, dtype=torch.float64)
    x[:, lead] = (mix @ x[:, :lead])[:, 0] + 1e-9 * torch.randn(4, d, generator=g, dtype=torch.float64)
    gram = x @ x.transpose(1, 2)  # (4, k, k)
    lam_hi = fast.lam_hi_bound(gram, None)
    ratio = (lambda sv: sv[:, -1] / sv[:, 0])(torch.linalg.svdvals(x))
    ceilings = {}
    for route, loop_k in ROUTES.items():
        tune(monkeypatch, ceiling_loop_k=loop_k)
        dep, ceiling = fast.prove_dependent(gram.clone(), lam_hi, 1e-3, d, ceilings=True, rows=lambda p: x[p])
        assert dep.all()
        assert torch.all(ceiling >= ratio * (1 - 1e-9)) and torch.all(ceiling < 1e-6)
        ceilings[route] = ceiling
    atol = route_atol(gram, x, torch.minimum(*ceilings.values()), rows=True)
    assert torch.all((ceilings["per-matrix"] - ceilings["batched"]).abs() <= atol)


def test_power_lower_of_one_matrix_is_the_batched_bound():
    """A single (k, k) matrix gets the bound of its batch (0-d), up to rounding, below lambda_max."""
    g = torch.Generator().manual_seed(31)
    x = torch.randn(5, 30, 50, generator=g, dtype=torch.float64)
    gram = x @ x.transpose(1, 2)  # (5, 30, 30)
    batched = fast.kernels.power_lower(gram, steps=2)
    lam_max = torch.linalg.eigvalsh(gram)[:, -1]
    for i in range(5):
        one = fast.kernels.power_lower(gram[i], steps=2)
        assert one.shape == () and float(one) <= float(lam_max[i])
        # each of the steps' length-k products (and its norm) rounds by k eps in either route
        rel = 4 * 2 * 30 * torch.finfo(torch.float64).eps
        assert math.isclose(float(one), float(batched[i]), rel_tol=rel)


def test_products_per_matrix_equal_the_batched_product(monkeypatch):
    """From ``ceiling_loop_k`` on (CPU) G v is taken matrix by matrix: within the rounding of a length-k
    dot product of the batched product, and power_lower's bound with it within 1e-12 of the batched
    route's, below lambda_max."""
    g = torch.Generator().manual_seed(33)
    x = torch.randn(6, 40, 70, generator=g, dtype=torch.float64)
    gram = x @ x.transpose(1, 2)  # (6, 40, 40)
    v = torch.randn(6, 40, 1, generator=g, dtype=torch.float64)
    lam_max = torch.linalg.eigvalsh(gram)[:, -1]
    bounds, calls, mv = {}, [], torch.mv
    monkeypatch.setattr(torch, "mv", lambda *a, **kw: calls.append(1) or mv(*a, **kw))
    for route, loop_k in ROUTES.items():
        tune(monkeypatch, ceiling_loop_k=loop_k)
        calls.clear()
        gv = fast.kernels.products(gram, v)
        assert len(calls) == (6 if route == "per-matrix" else 0)
        scale = (gram.abs() @ v.abs()).amax()
        assert gv.shape == v.shape and float((gv - gram @ v).abs().max()) <= 2 * 40 * 2.0**-52 * float(scale)
        bounds[route] = fast.kernels.power_lower(gram, steps=3)
        assert torch.all(bounds[route] <= lam_max)
    rel = 4 * 3 * 40 * torch.finfo(torch.float64).eps  # 3 steps of length-40 products and norms, both routes
    torch.testing.assert_close(bounds["per-matrix"], bounds["batched"], rtol=rel, atol=0)


class _CountedGram(torch.Tensor):
    """A Gram batch that counts the products G @ v taken with it (square left operand)."""

    products = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("__matmul__", "matmul"):
            cls.products += int(args[0].shape[-1] == args[0].shape[-2] > 1)
        return super().__torch_function__(func, types, args, kwargs or {})


def _power_loop(gram: torch.Tensor, steps: int) -> torch.Tensor:
    """The bound of ``steps`` power steps taken to the end (what power_lower computes when they do not
    converge)."""
    v = torch.ones(*gram.shape[:-1], 1, dtype=gram.dtype)
    for _ in range(steps):
        v = gram @ v
        v = v / v.norm(dim=-2, keepdim=True)
    rayleigh = (v.mT @ (gram @ v))[..., 0, 0]
    return torch.maximum(gram.diagonal(dim1=-2, dim2=-1).amax(-1), rayleigh) * (1 - 4 * 30 * 2.0**-52)


def test_power_lower_stops_where_the_rayleigh_quotients_stop_moving():
    """Rows with a dominant common direction (real tokens' mean): the power steps stop after three
    products, with a bound below lambda_max and within 1e-11 of it; random rows never converge in four
    steps, and their bound is the one of the four steps taken to the end (same kernels, same process)."""
    g = torch.Generator().manual_seed(32)
    x = torch.randn(5, 30, 50, generator=g, dtype=torch.float64)
    mean = 100 * torch.randn(1, 1, 50, generator=g, dtype=torch.float64)
    for rows, converges in ((x + mean, True), (x, False)):
        gram = rows @ rows.transpose(1, 2)  # (5, 30, 30)
        _CountedGram.products = 0
        bound = fast.kernels.power_lower(gram.as_subclass(_CountedGram), steps=4).as_subclass(torch.Tensor)
        lam_max = torch.linalg.eigvalsh(gram)[:, -1]
        assert torch.all(bound <= lam_max)
        if converges:
            assert _CountedGram.products == 3
            assert torch.all(bound >= lam_max * (1 - 1e-11))
        else:
            assert _CountedGram.products == 5
            assert torch.equal(bound, _power_loop(gram, 4))


def test_reach_credits_proven_margins_and_leaves_ranks_unchanged(small_chunks):
    """Certifying at a larger margin first (the robustness grid's top) changes no rank, and every
    credited margin stays at or below the exact margin of the float64 SVD."""
    x = cluster_pool(60, 24, 6, seed=21)
    k, rtol = 10, 1e-3
    subsets = probes.sample_subsets(60, k, 600, seed=22)
    plain = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=5, workers=2)
    reach = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=5, workers=2, reach=1.0)
    assert torch.equal(plain.rank, reach.rank)
    sv = torch.linalg.svdvals(x[subsets])
    exact = torch.log10(sv[:, -1] / sv[:, 0] / rtol)
    full = reach.rank == k
    assert torch.all(reach.margin[full] <= exact[full] + 1e-9)
    assert (reach.margin[full] >= 1.0).double().mean() > 0.5  # the reach was used


def test_tight_lambda_max_with_the_residual_brackets_slow_power_iterations():
    """Top eigenvalues close together (power steps far from converged): theta (1 + 1e-3) proves
    little, theta + 2 |G v - theta v| proves an upper end for every matrix; both ends always hold,
    and lambda_max brackets passed to decide() give the SVD's ranks without stage 1c."""
    blocks = [with_singular_values([1.0, 0.92, 0.85, 0.3, 0.1, 1e-3 * (0.9 if i % 2 else 1.1)], 6, 14,
                                   seed=200 + i) for i in range(40)]
    x, subsets = blocks_pool(blocks)
    gram = (x @ x.T)[subsets[:, :, None], subsets[:, None, :]]
    lam = torch.linalg.eigvalsh(gram)[:, -1]
    plain_lo, plain_hi = fast.tight_lambda_max(gram.clone())
    lo, hi = fast.tight_lambda_max(gram.clone(), residual=True)
    for a, b in ((plain_lo, plain_hi), (lo, hi)):
        assert torch.all(a <= lam) and torch.all(lam <= b)
    share, plain_share = torch.isfinite(hi).double().mean(), torch.isfinite(plain_hi).double().mean()
    assert share >= 0.9 and plain_share < share
    for rtol in (1e-3 * 0.95, 1e-3 * 1.05, 3e-3):
        dec = fast.decide(gram.clone(), lambda pos: x[subsets[pos]], rtol, 14, exact_dependent=0, floor=0.0,
                           lam_bounds=(lo, hi))
        assert torch.equal(dec.rank == 6, reference(x, subsets, rtol).rank == 6)


def test_tight_lambda_max_brackets_the_largest_eigenvalue_and_decides_the_band():
    """Rows with a dominant common direction (Gershgorin and trace bounds loose by ~k) and ratios
    within 10% of the tolerance on either side: stage 1c brackets lambda_max to 0.1% and decides them
    as the float64 SVD does, leaving the exact stage almost nothing."""
    g = torch.Generator().manual_seed(31)
    blocks = []
    for i in range(60):
        x = with_singular_values([1.0, 0.5, 0.3, 0.1, 1e-3 * (0.9 if i % 2 else 1.1)], 5, 12, seed=100 + i)
        blocks.append(x + 0.0 * torch.randn(5, 12, generator=g, dtype=torch.float64))
    x, subsets = blocks_pool(blocks)
    gram = (x @ x.T)[subsets[:, :, None], subsets[:, None, :]]
    lam = torch.linalg.eigvalsh(gram)[:, -1]
    lo, hi = fast.tight_lambda_max(gram.clone())
    assert torch.all(lo <= lam) and torch.all(lam <= hi) and torch.all(hi <= lam * 1.0011)
    rtol = 1e-3
    dec = fast.decide(gram, lambda pos: x[subsets[pos]], rtol, 12, exact_dependent=0)
    svd = reference(x, subsets, rtol).rank
    assert torch.equal(dec.rank == 5, svd == 5)
    assert dec.stages["eigvalsh"] + dec.stages["svd"] <= 3


@pytest.mark.parametrize("noise", [0.0, 1e-12, 1e-9, 1e-6])
def test_rows_rayleigh_bound_is_an_upper_bound_far_below_the_gram_floor(noise):
    """The ceiling from the rows themselves (|X^T v| / |v|) never undercuts lambda_min (float64 SVD) and,
    for nearly dependent rows, lies near the truth, where the Gram matrix's Rayleigh bound stops at its
    rounding floor (about (k + d) u trace)."""
    k, d = 40, 300
    g = torch.Generator().manual_seed(21)
    base = torch.randn(k - 1, d, generator=g, dtype=torch.float64)
    last = torch.randn(1, k - 1, generator=g, dtype=torch.float64) @ base  # dependent on the others
    x = torch.cat([base, last + noise * torch.randn(1, d, generator=g, dtype=torch.float64)])[
        None
    ]  # (1, k, d)
    gram = x @ x.transpose(1, 2)
    v = torch.cat(
        [-torch.linalg.solve(gram[0, :-1, :-1], gram[0, :-1, -1:]), torch.ones(1, 1, dtype=torch.float64)]
    )
    v = v[None]  # (1, k, 1)
    norms = x.norm(dim=2) * (1 + 1e-15)
    r_rows = fast.kernels.rows_rayleigh_up(x, v, norms)
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    r_gram = fast.kernels.rayleigh_up(gram, v, trace, d, slice(None))
    lam_min = torch.linalg.svdvals(x[0])[-1] ** 2
    assert float(r_rows) >= float(lam_min) * (1 - 1e-9)
    assert float(r_rows) <= float(r_gram) * (1 + 1e-9)
    if noise <= 1e-9:
        assert float(r_rows) < 1e-6 * float(r_gram)  # far below the Gram route's rounding floor


def test_pool_products_equal_the_gathered_products_within_dot_product_rounding(monkeypatch):
    """X_S^T v as one product with the whole pool (exact zeros outside the subset's rows) agrees with the
    product of the gathered rows within the rounding of two m-term dot products; subsets with a repeated
    row, and pools larger than ``Tuning.times_pool`` m, take the gathered rows (bit for bit the same
    call)."""
    n, d, m = 60, 24, 12
    x = generic(n, d, 41)
    pool = pool_of(x, m, 1e-3)
    g = torch.Generator().manual_seed(42)
    idx = torch.stack([torch.randperm(n, generator=g)[:m] for _ in range(9)])
    v = torch.randn(9, m, 1, generator=g, dtype=torch.float64)
    gathered = (v.transpose(1, 2) @ x[idx])[:, 0]  # (9, d)
    bound = 2 * 1.01 * m * (fast.errors.F64_EPS / 2) * (v.abs().transpose(1, 2) @ x[idx].abs())[:, 0]
    assert n <= fast.tuning.TUNING.times_pool * m
    assert torch.all((pool.times(idx, v) - gathered).abs() <= bound)
    rows = pool.rows_of(idx)
    pos = torch.tensor([4, 1])
    assert torch.equal(rows.times(pos, v[pos]), pool.times(idx[pos], v[pos]))
    assert torch.equal(rows(pos), x[idx[pos]])
    repeated = idx.clone()
    repeated[:, 1] = repeated[:, 0]
    assert torch.equal(pool.times(repeated, v), (v.transpose(1, 2) @ pool.rows(repeated))[:, 0])
    tune(monkeypatch, times_pool=1.0)
    assert torch.equal(pool.times(idx, v), (v.transpose(1, 2) @ pool.rows(idx))[:, 0])


@pytest.mark.parametrize("times_pool", [0.0, 8.0])
def test_exactly_dependent_subsets_get_ceilings_below_the_grid_at_wide_shapes(times_pool, monkeypatch):
    """Cluster pool at a shape where the Gram route's rounding floor (about sqrt((k + d) u trace /
    lambda_max)) lies above 0.1 x rtol: the rows' bound still puts the exactly dependent subsets below it,
    and never below their SVD ratio; with the rows' products gathered (``times_pool`` 0) or taken from
    the whole pool (N = 300 <= 8 k)."""
    tune(monkeypatch, times_pool=times_pool)
    n, d, k = 300, 320, 256
    g = torch.Generator().manual_seed(22)
    x = torch.randn(n, d, generator=g)
    x[: n // 2] = torch.randn(n // 2, k // 2, generator=g) @ torch.randn(k // 2, d, generator=g)
    x = x.double()
    rtol = probes.default_rtol(k, d, torch.float32)
    subsets = probes.sample_subsets(n, k, 40, seed=23)
    dec = fast.subset_decisions(x, subsets, rtol, x @ x.T, exact_dependent=0, ceilings=True, workers=1)
    proven = dec.rank == -1
    assert proven.sum() > 5
    sv = torch.linalg.svdvals(x[subsets[proven]])
    assert torch.all(dec.ceiling[proven] >= (sv[:, -1] / sv[:, 0]) * (1 - 1e-9))
    assert (
        dec.ceiling[proven] < 0.1 * rtol
    ).double().mean() > 0.9  # (stage 1b proper gives none below k = 384)


# ------------------------------------------------------------------ batched LAPACK spread over the threads


def test_spread_solves_pieces_on_one_torch_thread_each_with_the_batch_result():
    """With two torch threads, a batch of eigenvalue problems is solved in two pieces on worker threads
    with one torch thread each (what spares LAPACK's small parallel regions under the passive wait
    policy), and the eigenvalues equal the whole batch's to within the float64 rounding of eigvalsh;
    inside one torch thread (a worker) it is one call."""
    g = torch.Generator().manual_seed(33)
    x = torch.randn(7, 40, 60, generator=g, dtype=torch.float64)
    gram = x @ x.transpose(1, 2)  # (7, 40, 40)
    seen = []

    def eig(batch: torch.Tensor) -> torch.Tensor:
        seen.append((batch.shape[0], torch.get_num_threads()))
        return torch.linalg.eigvalsh(batch)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        spread_out = fast.threads.spread(eig, gram)
        assert sorted(seen) == [(3, 1), (4, 1)] and torch.get_num_threads() == 2
        seen.clear()
        torch.set_num_threads(1)
        # one torch thread: spread makes one call on the whole batch, the same call as the reference
        assert torch.equal(fast.threads.spread(eig, gram), torch.linalg.eigvalsh(gram))
        assert seen == [(7, 1)]
    finally:
        torch.set_num_threads(before)
    whole = torch.linalg.eigvalsh(gram)
    scale = whole[:, -1:]  # (7, 1): eigvalsh is backward stable, |error| <= c k eps lambda_max
    assert torch.all((spread_out - whole).abs() <= 64 * 40 * torch.finfo(torch.float64).eps * scale)


def _blas_threads() -> list[int]:
    return [info["num_threads"] for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]


def test_eigvalsh_by_numpy_matches_torch_on_one_blas_thread_and_restores_it(monkeypatch):
    """The fast path's float64 eigenvalues on the CPU (NumPy's LAPACK) equal torch's within the backward
    error of a symmetric eigensolver, a few k eps lambda_max; spread over two worker threads, NumPy's BLAS
    runs on one thread in each, on one thread where torch has one, and gets the user's setting back
    afterwards; with ``eigen_numpy`` off it is torch's routine, bit for bit."""
    g = torch.Generator().manual_seed(34)
    x = torch.randn(6, 50, 80, generator=g, dtype=torch.float64)
    gram = x @ x.transpose(1, 2)  # (6, 50, 50)
    ref = torch.linalg.eigvalsh(gram)
    seen, solve = [], np.linalg.eigvalsh

    def spy(a):
        seen.append(_blas_threads())
        return solve(a)

    monkeypatch.setattr(np.linalg, "eigvalsh", spy)
    bound = 8 * 50 * torch.finfo(torch.float64).eps * ref[:, -1:]
    got = fast.threads.eigvalsh(gram)
    assert got.dtype == torch.float64 and got.shape == ref.shape
    assert torch.all((got - ref).abs() <= bound)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    before = _blas_threads()
    seen.clear()
    try:
        assert torch.all((fast.threads.spread(fast.threads.eigvalsh, gram) - ref).abs() <= bound)
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 2 and all(s and set(s) == {1} for s in seen)
    assert _blas_threads() == before
    seen.clear()
    torch.set_num_threads(1)  # (as ``audit --threads 1``: one BLAS thread outside the workers too)
    try:
        fast.threads.eigvalsh(gram)
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 1 and seen[0] and set(seen[0]) == {1} and _blas_threads() == before
    tune(monkeypatch, eigen_numpy=False)
    seen.clear()
    # torch's eigvalsh on the same batch with the thread count ref was computed with: the same call
    assert torch.equal(fast.threads.eigvalsh(gram), ref) and not seen


def test_exact_ranks_for_every_subset_skip_certificates_where_most_are_dependent(small_chunks, monkeypatch):
    """Without dependence proofs (exact ranks for every subset), once a chunk is mostly dependent the
    next ones go straight to the exact stages: far fewer factorisations, and the same ranks and margins
    as with the certificates tried first (``exact_first_share`` 1: never skipped) and as the float64 SVD."""
    x = cluster_pool(60, 24, 4, seed=35)
    k, rtol = 12, 1e-3  # (most 12-subsets hold more than 4 of the 30 clustered vectors)
    subsets = probes.sample_subsets(60, k, 400, seed=36)
    factorised, cholesky_ex = [], torch.linalg.cholesky_ex

    def spy(a, *args, **kwargs):
        factorised.append(a.shape[0] if a.dim() == 3 else 1)
        return cholesky_ex(a, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "cholesky_ex", spy)
    runs = {}
    for share in (1.0, 0.5):
        tune(monkeypatch, exact_first_share=share)
        factorised.clear()
        dec = fast.subset_decisions(x, subsets, rtol, x @ x.T, workers=1)
        runs[share] = (dec, sum(factorised))
    (always, n_always), (skipped, n_skipped) = runs[1.0], runs[0.5]
    assert (skipped.rank < k).double().mean() > 0.5
    sv = torch.linalg.svdvals(x[subsets])
    assert torch.equal(skipped.rank, (sv > rtol * sv[:, :1]).sum(-1))
    assert torch.equal(skipped.rank, always.rank)
    full = always.rank == k
    # (the two runs may take a dependent subset's spectrum from different routes, eigenvalues or SVD: stage
    # 2's error band depends on the lambda_max bound, which stage 1c tightens; within both bands the margins
    # agree to about 1e-8 decades here, err / tol^2 ~ 1e-7). A float64 Gram eigenvalue is off by at most
    # (d + k) eps lambda_max, so a deciding sigma = tol 10^(+-m) (log10 sigma moves by dlambda / (2 lambda
    # ln 10)) by (d + k) eps 10^(2m) / (2 rtol^2 ln 10) decades; the two routes together by twice that
    m = always.margin[~full]
    bound = (x.shape[1] + k) * torch.finfo(torch.float64).eps * 10 ** (2 * m.abs()) / (rtol**2 * math.log(10))
    assert torch.all((skipped.margin[~full] - m).abs() <= bound), (skipped.margin[~full] - m).abs().max()
    assert torch.all(skipped.margin[full] >= always.margin[full] - 1e-12)  # exact where it was a bound
    assert n_skipped < n_always / 4
