"""The probes library at the edges: defaults, progress and bounds, typed results, extreme scales,
integer-like arguments and seeds."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import margin_atol

import probes
from probes import fast


def generic(n: int, d: int, seed: int = 0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def planted(seed: int = 0) -> torch.Tensor:
    """30 vectors in R^10: 20 generic, 10 in a 3-dim subspace (Kruskal rank 3; some 5-subsets fail)."""
    cluster = generic(10, 3, seed=seed + 1) @ generic(3, 10, seed=seed + 2)
    return torch.cat([generic(20, 10, seed=seed), cluster])


def verdict(res: probes.KruskalResult) -> tuple:
    return res.fraction, res.full_rank, res.rank_counts, res.witness, res.exhaustive, res.subsets


# ---------------------------------------------------------------- defaults, progress, bounds


def test_library_defaults_equal_the_cli_defaults():
    from auditor.audit.runner import AuditConfig

    config = {f.name: f.default for f in dataclasses.fields(AuditConfig)}
    assert inspect.signature(probes.kruskal_sweep).parameters["subsets"].default == config["sweep_subsets"]
    assert inspect.signature(probes.kruskal_sweep).parameters["refine"].default == config["sweep_refine"]
    for fn in (probes.kruskal_test, probes.assumption1, probes.assumption3, probes.general_position):
        assert inspect.signature(fn).parameters["subsets"].default == config["subsets"]
    for fn in (probes.kruskal_test, probes.kruskal_sweep, probes.kruskal_rank_exact, probes.assumption1,
               probes.assumption3, probes.general_position):
        assert inspect.signature(fn).parameters["progress"].default is None


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_automatic_for_large_work_in_a_terminal(monkeypatch):
    x = planted()
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    probes.kruskal_test(x, 5, subsets=200)  # small: no bar even in a terminal
    assert terminal.getvalue() == ""
    probes.kruskal_test(x, 5, subsets=1500)  # large: a bar
    assert "kruskal k=5" in terminal.getvalue()
    quiet = _Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    probes.kruskal_test(x, 5, subsets=1500, progress=False)
    assert quiet.getvalue() == ""


def test_progress_is_silent_when_not_interactive_unless_forced(capsys):
    x = planted()
    probes.kruskal_test(x, 5, subsets=1500)  # captured stderr is not a terminal
    probes.kruskal_sweep(x, [2, 3, 4, 5])
    assert capsys.readouterr().err == ""
    probes.kruskal_test(x, 5, subsets=300, progress=True)
    probes.kruskal_sweep(x, [2, 5], subsets=100, progress=True)
    probes.kruskal_rank_exact(x[:8], progress=True)
    err = capsys.readouterr().err
    assert "kruskal k=5" in err and "kruskal sweep" in err and "exact Kruskal rank" in err
    with pytest.raises(ValueError, match="progress must be True, False or None"):
        probes.kruskal_test(x, 5, progress="yes")


def test_progress_does_not_change_any_number(monkeypatch):
    """With a bar the subsets are decided in pieces; small chunks force many pieces, with dependence
    proofs and a shared exact-rank budget: the result must be identical."""
    monkeypatch.setattr(fast, "chunk_size", lambda k, d, budget_bytes=0: 7)
    x = torch.cat([generic(14, 10, seed=30), generic(12, 4, seed=31) @ generic(4, 10, seed=32)]).float()
    for rank_sample in (5, None):
        quiet = probes.kruskal_test(x, 10, subsets=400, seed=3, rank_sample=rank_sample, progress=False)
        shown = probes.kruskal_test(x, 10, subsets=400, seed=3, rank_sample=rank_sample, progress=True)
        assert quiet.stages["cholesky_dependent" if rank_sample else "eigvalsh"] > 5
        assert quiet.to_dict() | {"seconds": 0} == shown.to_dict() | {"seconds": 0}


def test_sweep_max_seconds_truncates_and_says_so():
    x = planted()
    full = probes.kruskal_sweep(x, [2, 3, 4, 5, 6], subsets=200)
    assert not full.truncated and full.skipped == ()
    cut = probes.kruskal_sweep(x, [2, 3, 4, 5, 6], subsets=200, max_seconds=1e-9)  # only the first k
    assert cut.truncated and cut.skipped == (3, 4, 5, 6) and [r.k for r in cut.results] == [2]
    assert "truncated" in repr(cut)
    assert cut.results[0].to_dict() | {"seconds": 0} == full.results[0].to_dict() | {"seconds": 0}
    coarse = probes.kruskal_sweep(x, [2, 8], subsets=200, refine=4, max_seconds=1e-9)
    assert coarse.truncated and coarse.refined == () and [r.k for r in coarse.results] == [2]
    for bad in (0, -1.0, float("nan"), float("inf"), True, "10"):
        with pytest.raises(ValueError, match="max_seconds must be a positive number"):
            probes.kruskal_sweep(x, [2], max_seconds=bad)


def test_huge_subset_counts_are_refused_before_allocating():
    x = generic(200, 120)
    limit = probes.max_subsets_in_memory(100)
    assert 10**5 < limit < 10**9
    with pytest.raises(ValueError, match=rf"valid: 1 <= subsets <= {limit:,} at k = 100"):
        probes.kruskal_test(x, 100, subsets=10**9)
    with pytest.raises(ValueError, match="valid: 1 <= subsets <="):
        probes.assumption1(x, 100, subsets=10**9)
    with pytest.raises(ValueError, match="valid: 1 <= subsets <="):
        probes.kruskal_sweep(x, [5, 100], subsets=10**9)
    with pytest.raises(ValueError, match="valid: 1 <= count <="):
        probes.sample_subsets(200, 100, 10**9, seed=0)
    # a huge request over few subsets is exhaustive and fine: only C(N, k) of them exist
    small = probes.kruskal_test(generic(7, 4), 2, subsets=10**9)
    assert small.exhaustive and small.subsets == 21


# ---------------------------------------------------------------- typed results and repr


def test_to_dict_returns_typed_values():
    x = planted()
    row = probes.kruskal_test(x, np.int64(5), subsets=np.int64(300), seed=np.int64(2)).to_dict()
    for key in ("k", "N", "d", "subsets", "full_rank", "seed"):
        assert type(row[key]) is int, key
    for key in ("fraction", "min_margin", "rtol", "seconds"):
        assert type(row[key]) is float, key
    assert type(row["exhaustive"]) is bool
    assert isinstance(row["witness"], list) and all(type(i) is int for i in row["witness"])
    assert all(type(r) is int and type(c) is int for r, c in row["rank_counts"].items())
    assert all(type(c) is int for c in row["stages"].values())
    assert sum(row["rank_counts"].values()) == 300

    contexts = generic(30 * 5, 10, seed=4).reshape(30, 5, 10)
    for res in (probes.assumption1(x, 5, subsets=300), probes.assumption3(contexts, x, subsets=300),
                probes.general_position(x, subsets=300, n=np.int64(5)), probes.assumption2(contexts)):
        d = res.to_dict()
        for key in ("k", "N", "d", "subsets"):
            assert type(d[key]) is int, (res.test, key)
        assert type(d["n"]) is int and type(d["exhaustive"]) is bool
        assert type(d["share_meets_threshold"]) is bool
        assert all(type(d[key]) is float for key in ("fraction", "min_margin", "rtol", "threshold"))
        assert d["witness"] is None or all(type(i) is int for i in d["witness"])
        assert all(type(r) is int and type(c) is int for r, c in d["rank_counts"].items())
        json.dumps(d)  # plain Python values throughout
    a1 = probes.assumption1(x, 5, subsets=300).to_dict()
    assert a1["witness"] == list(probes.assumption1(x, 5, subsets=300).witness)
    assert probes.assumption2(contexts).to_dict()["witness"] is None


def test_flatten_row_and_sweep_frame_keep_the_compact_csv_cells():
    x = torch.cat([generic(6, 5), generic(1, 5)])
    x[6] = x[2]
    res = probes.kruskal_test(x, 2, subsets=1000)
    flat = probes.flatten_row(res.to_dict())
    assert flat["witness"] == "2 6" and flat["rank_counts"] == "1:1;2:20"
    assert flat["stages"].startswith("cholesky:")
    assert probes.flatten_row({"witness": None, "rank_counts": {}})["witness"] == ""
    frame = probes.kruskal_sweep(x, [1, 2], subsets=100).frame()
    assert frame["witness"].tolist() == ["", "2 6"] and frame["rank_counts"].tolist() == ["1:7", "1:1;2:20"]


def test_results_have_a_readable_one_line_repr():
    x = planted()
    a1 = probes.assumption1(x, 3, subsets=500)
    kind = "exact" if a1.robustness.exact(a1.rtol) else "bound"
    assert repr(a1) == (
        f"AssumptionResult(assumption1: not decided; fraction=1.0000 over 500 sampled subsets at k=3, "
        f"meets threshold 0.99, N=30, d=10, min_margin={a1.min_margin:.2f} decades, "
        f"critical_rtol={a1.robustness.critical_rtol:.3g} in "
        f"[{a1.robustness.critical_rtol_low:.3g}, {a1.robustness.critical_rtol_high:.3g}] "
        f"({kind}; rtol={a1.rtol:.3g}))"
    )
    bad = probes.assumption1(x, 5, subsets=500)
    assert "assumption1: refuted;" in repr(bad) and f"witness={list(bad.witness)}" in repr(bad)
    assert "holds" not in repr(a1) + repr(bad)
    a2 = probes.assumption2(generic(30 * 5, 10).reshape(30, 5, 10))
    assert repr(a2).startswith(
        "AssumptionResult(assumption2: proven; fraction=1.0000 of 30 contexts with rank n=5"
    )
    gp = probes.general_position(generic(40, 20) @ generic(20, 30, seed=1), subsets=100)  # rank 20 < 30
    assert "\n" not in repr(gp) and "general_position: refuted;" in repr(gp)
    assert re.search(r"witness=\[(\d+, ){8}\.\.\. \(30 indices\)\]\)$", repr(gp))
    kr = probes.kruskal_test(x, 3, subsets=200)
    assert repr(kr).startswith("KruskalResult(k=3, N=30, d=10: fraction=1.0000 (200/200 full rank) over 200")
    sweep = probes.kruskal_sweep(x, [2, 8], subsets=300, refine=3)
    assert repr(sweep) == (f"SweepResult(k=2..8 ({len(sweep.results)} values, {len(sweep.refined)} refined): "
                           f"sampled >= 3, lower_estimate=3, upper_bound=3)")


# ---------------------------------------------------------------- extreme scales


SCALES = [1e-170, 1e160, 1e-300, 1e300, 2.0**-900, 2.0**900]


@pytest.mark.parametrize("scale", SCALES)
def test_kruskal_verdicts_do_not_depend_on_the_scale(scale):
    """Float64 Gram matrices of such data underflow or overflow; the rank verdicts may not. Margins:
    identical under an exact power of two; otherwise the rounding of ``x * scale`` moves the noise-level
    singular values of exactly dependent subsets, so only full-rank margins are compared."""
    x = planted()
    exact_pow2 = math.frexp(scale)[0] == 0.5
    for k in (3, 5, 10):
        ref, res = probes.kruskal_test(x, k, subsets=400), probes.kruskal_test(x * scale, k, subsets=400)
        assert verdict(res) == verdict(ref)
        assert (ref.fraction == 1.0) == (k == 3)
        if exact_pow2:  # the same computation up to an exact power of two
            assert res.min_margin == ref.min_margin
        elif ref.fraction == 1.0:  # x * scale rounds each entry (sqrt(k d) eps / 2 of sigma_max in norm);
            # the Gram route moves a deciding sigma = rtol smax 10^m by (d + k) eps smax^2 / (2 sigma)
            d, m, eps = x.shape[1], ref.min_margin, torch.finfo(torch.float64).eps
            rel = math.sqrt(k * d) * eps / 2 + (d + k) * eps / (ref.rtol * 10**m)
            assert res.min_margin == pytest.approx(ref.min_margin, abs=margin_atol(m, ref.rtol, rel))
    ref, res = probes.kruskal_sweep(x, [2, 8], refine=4), probes.kruskal_sweep(x * scale, [2, 8], refine=4)
    assert (res.lower_estimate, res.upper_bound, res.refined) == (
        ref.lower_estimate,
        ref.upper_bound,
        ref.refined,
    )
    assert [verdict(r) for r in res.results] == [verdict(r) for r in ref.results]
    assert probes.kruskal_rank_exact(x[15:27] * scale) == probes.kruskal_rank_exact(x[15:27]) == 3
    witness = probes.kruskal_test(x * scale, 5, subsets=400).witness
    assert probes.check_witness(x * scale, witness) and not probes.check_witness(x * scale, witness[:3])
    assert (
        probes.general_position(x * scale, subsets=200).fraction
        == probes.general_position(x, subsets=200).fraction
    )


@pytest.mark.parametrize("scale", SCALES)
def test_rank_and_assumption_verdicts_do_not_depend_on_the_scale(scale):
    contexts = generic(8 * 4, 6, seed=20).reshape(8, 4, 6)
    contexts[3, 3] = contexts[3, 0] - 2 * contexts[3, 1]
    ranks = probes.context_ranks(contexts * scale)
    ref = probes.context_ranks(contexts)
    assert ranks.rank.tolist() == ref.rank.tolist() == [4, 4, 4, 3, 4, 4, 4, 4]
    full = ref.rank == 4  # margins of the exactly dependent context sit at rounding noise (see above)
    exact_pow2 = math.frexp(scale)[0] == 0.5
    assert (
        torch.equal(ranks.margin, ref.margin)
        if exact_pow2
        else torch.allclose(ranks.margin[full], ref.margin[full])
    )
    a2 = probes.assumption2(contexts * scale)
    assert (a2.fraction, a2.witness, a2.rank_counts) == (7 / 8, (3,), {3: 1, 4: 7})
    nr, nr_ref = probes.numerical_rank(contexts * scale), probes.numerical_rank(contexts)
    assert nr.rank.tolist() == nr_ref.rank.tolist()
    assert torch.allclose(nr.tol, nr_ref.tol * scale, rtol=1e-12)
    assert torch.allclose(nr.margin[full], nr_ref.margin[full])
    queries = generic(8, 6, seed=21)
    a3 = probes.assumption3(contexts * scale, queries * scale, 4, subsets=70)
    a3_ref = probes.assumption3(contexts, queries, 4, subsets=70)
    assert (a3.fraction, a3.rank_counts, a3.witness) == (a3_ref.fraction, a3_ref.rank_counts, a3_ref.witness)


def test_contexts_of_very_different_scales_are_each_judged_on_their_own():
    contexts = generic(4 * 3, 5, seed=5).reshape(4, 3, 5)
    contexts[1, 2] = contexts[1, 0] + contexts[1, 1]
    factors = torch.tensor([1e-170, 1e160, 1.0, 1e-300], dtype=torch.float64)[:, None, None]
    assert probes.context_ranks(contexts * factors).rank.tolist() == [3, 2, 3, 3]
    assert probes.numerical_rank(contexts * factors).rank.tolist() == [3, 2, 3, 3]


def test_data_at_the_ends_of_the_float64_range():
    x = generic(12, 6)
    top = x / x.abs().max() * torch.finfo(torch.float64).max  # largest finite values
    assert probes.kruskal_test(top, 6, subsets=100).fraction == 1.0
    assert int(probes.numerical_rank(top).rank) == 6
    assert math.isfinite(float(probes.numerical_rank(top).tol))
    tiny = x * 2.0**-1040  # subnormal: few significant bits, but clearly full rank
    assert probes.kruskal_test(tiny, 3, subsets=100).fraction == 1.0
    assert int(probes.numerical_rank(tiny[:3]).rank) == 3


def test_float32_data_is_used_as_given():
    x = planted().float()
    scaled, e = probes.rank.pow2_rescale(x)
    assert scaled is x and e is None
    y = planted()
    scaled, e = probes.rank.pow2_rescale(y)  # ordinary float64: no copy either
    assert scaled is y and e is None


@pytest.mark.parametrize(
    "call",
    [
        lambda bad: probes.kruskal_sweep(bad, [1]),
        lambda bad: probes.kruskal_rank_exact(bad),
        lambda bad: probes.check_witness(bad, (0, 1)),
        lambda bad: probes.numerical_rank(bad),
        lambda bad: probes.context_ranks(bad.reshape(1, 2, 3)),
        lambda bad: probes.assumption3(bad.reshape(2, 1, 3), bad),
        lambda bad: probes.general_position(bad),
    ],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_is_a_value_error(call, value):
    bad = torch.ones(2, 3, dtype=torch.float64)
    bad[1, 2] = value
    with pytest.raises(ValueError, match="NaN/Inf") as info:
        call(bad)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- integers and seeds


def test_numpy_integers_are_accepted_everywhere():
    x = planted()
    ref = probes.kruskal_test(x, 5, subsets=300, seed=2)
    res = probes.kruskal_test(x, np.int64(5), subsets=np.int32(300), seed=np.uint8(2))
    assert res.to_dict() | {"seconds": 0} == ref.to_dict() | {"seconds": 0}
    assert (
        probes.assumption1(x, np.int64(5), subsets=np.int64(300), seed=np.int64(2)).fraction == ref.fraction
    )
    sweep = probes.kruskal_sweep(
        x, np.arange(2, 6), subsets=np.int64(200), refine=np.int64(2), seed=np.int16(1)
    )
    assert [r.k for r in sweep.results] == [2, 3, 4, 5] and all(type(r.k) is int for r in sweep.results)
    assert torch.equal(probes.sample_subsets(np.int64(30), np.int64(5), np.int64(50), np.int64(7)),
                       probes.sample_subsets(30, 5, 50, 7))
    assert probes.kruskal_rank_exact(x[15:27], max_subsets=np.int64(10**4)) == 3
    assert probes.check_witness(x, np.array(ref.witness))
    assert probes.kruskal_test(x, torch.tensor(5), subsets=300, seed=2).fraction == ref.fraction


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda x: probes.kruskal_test(x, True), "k must be a positive integer"),
        (lambda x: probes.kruskal_test(x, 5.0), "k must be a positive integer"),
        (lambda x: probes.kruskal_test(x, np.float64(5)), "k must be a positive integer"),
        (lambda x: probes.kruskal_test(x, 5, subsets=True), "subsets must be a positive integer"),
        (lambda x: probes.kruskal_test(x, 5, subsets=300.0), "subsets must be a positive integer"),
        (lambda x: probes.kruskal_test(x, 5, rank_sample=-1), "rank_sample must be an integer >= 0"),
        (lambda x: probes.kruskal_test(x, 5, rtol=True), "rtol"),
        (lambda x: probes.assumption1(x, np.bool_(True)), "context length"),
        (lambda x: probes.assumption1(x, 5, threshold=np.True_), "threshold"),
        (lambda x: probes.general_position(x, n=2.5), "context length"),
        (lambda x: probes.kruskal_sweep(x, 5), "ks must be a list of subset sizes"),
        (lambda x: probes.kruskal_sweep(x, [2, 3.5]), "k must be a positive integer"),
        (lambda x: probes.kruskal_sweep(x, [2], refine=1.5), "refine must be an integer >= 0"),
        (lambda x: probes.kruskal_rank_exact(x, max_subsets=1e6), "max_subsets must be a positive integer"),
        (lambda x: probes.check_witness(x, (0, 30)), "distinct row indices in 0..29"),
        (lambda x: probes.check_witness(x, (1, 1)), "distinct row indices"),
        (lambda x: probes.check_witness(x, (0, -1)), "witness index must be an integer >= 0"),
        (lambda x: probes.numerical_rank(x, source_dtype="float32"), "source_dtype"),
    ],
)
def test_bad_integers_are_one_line_value_errors(call, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        call(planted())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("seed", "message"),
    [
        (0.5, "seed must be an integer, got 0.5"),
        (1.0, "seed must be an integer, got 1.0"),
        ("1", "seed must be an integer"),
        (True, "seed must be an integer"),
        (2**63, "seed must be an integer in [-2**63, 2**63 - 1] (64 bits), got 9223372036854775808"),
        (2**64 + 5, "64 bits"),
        (-(2**63) - 1, "64 bits"),
    ],
)
def test_bad_seeds_are_refused_with_the_valid_range(seed, message):
    x = planted()
    for call in (
        lambda: probes.kruskal_test(x, 5, subsets=100, seed=seed),
        lambda: probes.kruskal_sweep(x, [2, 3], subsets=100, seed=seed),
        lambda: probes.assumption1(x, 5, subsets=100, seed=seed),
        lambda: probes.general_position(x, subsets=100, seed=seed),
        lambda: probes.sample_subsets(30, 5, 10, seed),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


def test_seeds_across_the_whole_64_bit_range_work():
    x = planted()
    for seed in (-(2**63), -1, 0, 2**63 - 1, np.int64(-5)):
        res = probes.kruskal_test(x, 5, subsets=50, seed=seed)
        assert res.seed == int(seed) and type(res.seed) is int


# ---------------------------------------------------------------- documentation


def test_docstrings_do_not_cite_internal_documents():
    root = Path(probes.__file__).parent
    for path in root.glob("*.py"):
        assert not re.search(r"\bSPEC\b", path.read_text()), path.name
