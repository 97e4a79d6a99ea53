"""The public API a caller of probes builds on when it holds its contexts only block by block (the audit's
streamed contexts): reductions, result assembly from them, bounds at a result's own rtol, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import probes
from probes import fast, robust


def _contexts(num: int = 40, n: int = 4, d: int = 9, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    e = torch.randn(num, n, d, generator=gen).to(dtype)  # (N, n, d)
    e[5, 1] = e[5, 0]  # one rank-deficient context, so Assumption 2 has a witness
    return e


def _same(a: probes.AssumptionResult, b: probes.AssumptionResult) -> None:
    got, want = a.to_dict(), b.to_dict()
    del got["seconds"], want["seconds"]
    assert got == want


def test_assumption3_from_the_context_means_is_assumption3():
    e = _contexts()
    q = e[:, 0].clone()  # (N, d)
    for threshold in (0.5, 1.0):
        means = probes.context_means(e)  # (N, d) float64
        _same(probes.assumption3_from_means(q, means, 4, e.dtype, 300, 1, threshold=threshold),
              probes.assumption3(e, q, 4, 300, 1, threshold=threshold))


def test_assumption3_from_means_refuses_float64_tokens_and_mismatched_shapes():
    e = _contexts()
    q = e[:, 0].clone()
    with pytest.raises(ValueError, match="float64 contexts"):
        probes.assumption3_from_means(q.double(), probes.context_means(e), 4, torch.float64)
    with pytest.raises(ValueError, match=r"do not match the context means \(39, 9\)"):
        probes.assumption3_from_means(q, probes.context_means(e[:-1]), 4, e.dtype)


def test_assumption2_from_ranks_joined_by_block_and_read_back_is_assumption2():
    e = _contexts()
    num, n, d = e.shape
    ranks = probes.context_ranks(e)
    read = []

    def reader() -> robust.Matrices:  # the contexts as a caller that streamed them to disk reads them back
        def rows(pos: torch.Tensor) -> torch.Tensor:
            read.append(int(pos.numel()))
            return e[pos]

        return robust.context_reader(num, n, d, rows, "cpu")

    got = probes.assumption2_from_ranks(ranks, tuple(e.shape), e.dtype, e.device, reader, threshold=1.0)
    _same(got, probes.assumption2(e, threshold=1.0))
    assert got.witness == (5,) and sum(read) > 0  # the tolerance analysis read contexts back
    read.clear()
    probes.assumption2_from_ranks(ranks, tuple(e.shape), e.dtype, e.device, reader, robustness=False)
    assert not read  # without it, nothing is read
    with pytest.raises(ValueError, match="threshold must be a number in"):
        probes.assumption2_from_ranks(ranks, tuple(e.shape), e.dtype, e.device, reader, threshold=0)


def test_context_ranks_joined_in_order_are_the_parts_side_by_side():
    e = _contexts()
    first, second = probes.context_ranks(e[:15]), probes.context_ranks(e[15:])
    joined = probes.ContextRanks.concat([first, second])
    assert torch.equal(joined.rank, torch.cat([first.rank, second.rank]))
    assert torch.equal(joined.margin, torch.cat([first.margin, second.margin]))
    assert joined.stages == {k: first.stages[k] + second.stages[k] for k in first.stages}
    assert (joined.n, joined.d, joined.rtol) == (first.n, first.d, first.rtol)
    # one block: what one call on all of them gives
    whole = probes.context_ranks(e)
    assert probes.context_block(4, 9) >= e.shape[0]
    assert torch.equal(probes.ContextRanks.concat([whole]).rank, whole.rank)


def test_the_block_sizes_are_those_of_the_calls():
    assert probes.context_block(4, 9) == probes.context_block(9, 4) == fast.chunk_size(4, 9)
    from probes.geometry import CHUNK_BYTES, residual_block

    assert residual_block(4, 9) == CHUNK_BYTES // (8 * 4 * 9) and residual_block(10**6, 10**6) == 1


def test_result_bounds_are_taken_at_the_results_own_rtol():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 6, generator=gen, dtype=torch.float64)  # (N, d)
    x[7] = x[2]  # an exact duplicate
    result = probes.assumption1(x, 3, 200, 0, rtol=1e-6)
    tested = probes.TestedVectors(x)
    bounds = probes.result_bounds(result, tested)
    lower = probes.kruskal_lower_bound(x, rtol=1e-6)
    assert tested.lower(1e-6) is tested.lower(1e-6)  # computed once, shared by every test of these vectors
    assert bounds["krank_lower"] == lower.lower and bounds["krank_lower_method"] == lower.method
    assert bounds["duplicates"] == 1 and bounds["near_duplicates"] >= 1
    low, high = probes.clopper_pearson(round(result.fraction * result.subsets), result.subsets)
    assert (bounds["fraction_low"], bounds["fraction_high"]) == (low, high)
    # the duplicated pair is a dependent 2-subset that the lower bound's search meets: Kruskal rank 1
    assert lower.lower == 1 and lower.exact and bounds["krank_upper"] == 1
    every = probes.general_position(x[:6, :3], 5000, 0)  # C(6, 3) = 20: every subset tested
    interval = probes.result_bounds(every, x[:6, :3])
    assert every.exhaustive and interval["fraction_low"] == interval["fraction_high"] == every.fraction


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, math.nan, math.inf, True, "1e-3", None])
def test_check_rtol_is_the_one_rule(bad):
    if bad is None:
        assert probes.check_rtol(None) is None
        return
    with pytest.raises(ValueError, match=r"rtol must be a finite number in \(0, 1\)"):
        probes.check_rtol(bad)
    with pytest.raises(ValueError, match=r"rtol must be a finite number in \(0, 1\)"):
        probes.numerical_rank(torch.eye(3), rtol=bad)


def test_check_rtol_and_check_threshold_pass_good_values_as_floats():
    assert probes.check_rtol(1e-5) == 1e-5 and type(probes.check_rtol(np.float32(0.25))) is float
    assert probes.check_threshold(1) == 1.0 and isinstance(probes.check_threshold(1), float)
    for bad in (0, 1.01, math.nan, True):
        with pytest.raises(ValueError, match=r"threshold must be a number in \(0, 1\]"):
            probes.check_threshold(bad)
