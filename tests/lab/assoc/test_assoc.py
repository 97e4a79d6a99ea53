"""Capacity lab III, associative memories: models, bisection, fits, the sweep unit and the CLI."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import forward_atol

from auditor.cli import main
from auditor.core.errors import AuditError
from auditor.lab.assoc.experiment import (
    AssocConfig,
    AssocSweep,
    capacity_converged,
    guide_capacity,
    plateau_gain,
    probe_converged,
    run_bucket,
)
from auditor.lab.assoc.memories import (
    LinearMemory,
    MemoryMember,
    MemoryTask,
    build_memory,
    construction_weights,
    memory_parameters,
    unit_sphere,
)
from auditor.lab.common.search.capacity import (
    Bisection,
    fit_guide_constant,
    fit_power_law,
    invert_n_log_n,
    n_log_n,
    search_all,
)
from auditor.lab.common.search.convergence import PLATEAU_GAIN
from auditor.lab.common.search.summary import capacity_fits, capacity_markdown, facts_fits
from auditor.lab.engine import TrainConfig, train
from auditor.lab.recall.scaling import SCALING_PRESETS
from auditor.lab.sweep import run_unit

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def _fit_config(steps: int = 300, lr: float = 0.1, **overrides) -> TrainConfig:
    return TrainConfig(steps=steps, lr=lr, optimizer="adamw", warmup_frac=0.0, schedule="constant",
                       eval_every=10, **overrides)


# ---------------------------------------------------------------- memories


def test_unit_sphere_rows_have_norm_one_and_depend_on_the_seed():
    a = unit_sphere(50, 7, torch.Generator().manual_seed(1))
    b = unit_sphere(50, 7, torch.Generator().manual_seed(1))
    c = unit_sphere(50, 7, torch.Generator().manual_seed(2))
    assert a.shape == (50, 7)
    torch.testing.assert_close(a.norm(dim=1), torch.ones(50))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_orthonormal_embeddings_are_stored_exactly_by_the_construction():
    # e_x = standard basis, W = sum_x u_x e_x^T gives W e_x = u_x, and u_x^T u_x = 1 > u_y^T u_x for y != x
    d = 12
    inputs = torch.eye(d)[None]  # (1, N = d, d)
    outputs = unit_sphere(d, d, torch.Generator().manual_seed(0))[None]
    task = MemoryTask(inputs, outputs, torch.tensor([d]))
    model = LinearMemory(1, d, [torch.Generator().manual_seed(0)])
    with torch.no_grad():
        model.weight.copy_(construction_weights(inputs, outputs))
    assert task.accuracy(model).item() == 1.0


def test_construction_stores_few_random_items_and_fails_when_overloaded():
    d = 32
    model, task = build_memory("linear", d, [MemoryMember(8, seed=3), MemoryMember(2000, seed=3)])
    with torch.no_grad():
        model.weight.copy_(construction_weights(task.inputs, task.outputs))
    acc = task.accuracy(model)
    assert acc[0].item() == 1.0  # 8 nearly orthogonal items in d = 32
    assert acc[1].item() < 0.5  # 2000 items in d^2 = 1024 numbers cannot all be recalled


@pytest.mark.parametrize(("kind", "d", "m", "n"), [("linear", 16, 0, 24), ("mlp", 8, 32, 24)])
def test_a_trained_memory_of_known_small_size_stores_all_items(kind, d, m, n):
    model, task = build_memory(kind, d, [MemoryMember(n, seed=0)], m=m)
    result = train(model, task, _fit_config(steps=400, lr=0.1 if kind == "linear" else 0.03), progress=False)
    assert result.accuracy.item() == 1.0
    assert bool(task.correct(model)[0, :n].all())
    assert result.steps_trained.item() < 400  # early stop froze it


def test_padding_items_gives_each_member_its_own_problem():
    members = [MemoryMember(10, seed=1), MemoryMember(40, seed=2)]
    model, task = build_memory("mlp", 8, members, m=8)
    alone_model, alone_task = build_memory("mlp", 8, members[:1], m=8)
    torch.testing.assert_close(task.inputs[0, :10], alone_task.inputs[0])
    assert torch.all(task.inputs[0, 10:] == 0)
    torch.testing.assert_close(model.w1[0], alone_model.w1[0])
    torch.testing.assert_close(task.loss(model, None)[0], alone_task.loss(alone_model, None)[0])
    cfg = _fit_config(steps=60, lr=0.03, early_stop=False)
    train(model, task, cfg, progress=False)
    train(alone_model, alone_task, cfg, progress=False)
    # reductions over d (W1 and the scores), m (W2) and the padded N (softmax over answers, mean over
    # items); first order, each step adds at most one such rounding relative to the weights' scale
    width = 2 * 8 + 8 + 2 * 40
    atol = cfg.steps * forward_atol(alone_model.w1[0], width)
    torch.testing.assert_close(model.w1[0], alone_model.w1[0], atol=atol, rtol=0)
    torch.testing.assert_close(task.accuracy(model)[0], alone_task.accuracy(alone_model)[0])


def test_accuracy_counts_every_item_and_ignores_padding():
    model, task = build_memory("linear", 4, [MemoryMember(3, seed=0), MemoryMember(9, seed=1)])
    correct = task.correct(model)
    assert correct.shape == (2, 9)
    assert not correct[0, 3:].any()
    expected = torch.stack([correct[0, :3].double().mean(), correct[1].double().mean()])
    torch.testing.assert_close(task.accuracy(model), expected)


def test_memory_parameters_and_errors():
    assert memory_parameters("linear", 16) == 256
    assert memory_parameters("mlp", 16, 64) == 1024
    with pytest.raises(AuditError, match="unknown memory kind"):
        build_memory("lienar", 8, [MemoryMember(3, 0)])
    with pytest.raises(AuditError, match="at least one item"):
        MemoryMember(0, 0)
    with pytest.raises(AuditError, match="did you mean 'linear'"):
        AssocConfig(kind="linaer")
    with pytest.raises(AuditError, match="dims"):
        AssocConfig(dims=())
    with pytest.raises(AuditError, match="optimizer"):
        AssocConfig(optimizer="adamm")


# ---------------------------------------------------------------- bisection


@pytest.mark.parametrize(
    ("threshold", "lo", "hi"), [(37, 10, 20), (37, 40, 60), (37, 30, 45), (1, 5, 9), (250, 3, 4)]
)
def test_bisection_finds_a_planted_threshold_exactly(threshold, lo, hi):
    search = Bisection(lo, hi, max_size=1000)
    rounds = search_all([search], lambda pending: [n <= threshold for _, n in pending])
    assert search.capacity == threshold
    assert search.hi == threshold + 1
    assert rounds <= 2 * math.ceil(math.log2(1000)) + 2
    assert all((n <= threshold) == ok for n, ok in search.history)


def test_bisection_edge_cases():
    nothing = Bisection(4, 8, max_size=100)
    search_all([nothing], lambda pending: [False] * len(pending))
    assert nothing.capacity == 0
    everything = Bisection(4, 8, max_size=100)
    search_all([everything], lambda pending: [True] * len(pending))
    assert everything.capacity == 100 and everything.hi == 101  # never failed: a lower bound only
    with pytest.raises(AuditError):
        Bisection(8, 8, max_size=100)
    with pytest.raises(AuditError):
        Bisection(4, 8, max_size=100, rel_tol=1.5)


def test_bisection_relative_tolerance_brackets_the_threshold():
    search = Bisection(100, 200, max_size=10_000, rel_tol=0.05)
    search_all([search], lambda pending: [n <= 1234 for _, n in pending])
    assert search.lo <= 1234 < search.hi
    assert search.hi - search.lo <= max(1, math.floor(0.05 * search.lo))
    assert len(search.history) < 14  # fewer probes than an exact search from 100


def test_search_all_probes_every_pending_search_in_one_call_per_round():
    thresholds = [5, 50, 500]
    searches = [Bisection(10, 20, max_size=2000) for _ in thresholds]
    calls = []

    def probe(pending):
        calls.append(list(pending))
        assert len({i for i, _ in pending}) == len(pending)  # one probe per search per round
        return [n <= thresholds[i] for i, n in pending]

    rounds = search_all(searches, probe)
    assert [s.capacity for s in searches] == thresholds
    assert rounds == len(calls)
    assert len(calls[0]) == 3


# ---------------------------------------------------------------- fits


def test_power_law_fit_recovers_exponent_and_constant():
    x = np.geomspace(10, 10_000, 12)
    fit = fit_power_law(x, 3.0 * x**1.5)
    # noiseless data: only float64 rounding of a 12-point log-log least squares (n eps cond, with room)
    tol = 64 * len(x) * np.finfo(np.float64).eps * np.linalg.cond(np.c_[np.ones(len(x)), np.log(x)])
    assert fit.exponent == pytest.approx(1.5, abs=tol)
    assert fit.constant == pytest.approx(3.0, rel=tol * np.log(x).max())  # the slope error x log x
    assert fit.r2 == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    noisy = fit_power_law(x, 3.0 * x**1.5 * np.exp(rng.normal(0, 0.1, len(x))))
    lo, hi = noisy.ci95()
    assert lo < 1.5 < hi and noisy.exponent_se > 0
    with pytest.raises(AuditError):
        fit_power_law([1, 2], [1, 2])


def test_guide_constant_fit_and_n_log_n_inverse():
    n = np.array([20.0, 80.0, 300.0, 1000.0])
    fit = fit_guide_constant(1.3 * n_log_n(n), n_log_n(n))
    assert fit.constant == pytest.approx(1.3)
    assert fit.log_se == pytest.approx(0.0, abs=1e-12)
    for value in (5.0, 100.0, 12345.0):
        assert float(n_log_n(invert_n_log_n(value))) == pytest.approx(value, rel=1e-9)
    assert guide_capacity("linear", 32) == pytest.approx(invert_n_log_n(1024 / 1.3))


def test_capacity_fits_ignore_censored_points():
    rows = pd.DataFrame({
        "kind": ["linear"] * 4,
        "parameters": [64, 256, 1024, 4096],
        "capacity": [20, 60, 190, 4096],
        "first_fail": [21, 61, 191, None],  # the last search never failed
    })
    fits = capacity_fits(rows)["linear"]
    assert fits["censored"] == 1 and fits["points"] == 3
    assert 0.7 < fits["power"].exponent < 1.0


def _history(accuracy_at_step) -> pd.DataFrame:
    """One member's evaluations every 16 steps of a 1024-step budget."""
    steps = np.arange(0, 1025, 16)
    return pd.DataFrame({"step": steps, "accuracy": [accuracy_at_step(s) for s in steps]})


def test_a_probe_still_rising_at_the_step_limit_is_not_converged_and_a_plateaued_one_is():
    rising = _history(lambda s: 0.5 + 0.45 * s / 1024)  # +0.11 over the last quarter
    plateau = _history(lambda s: min(0.9, 0.5 + 0.8 * s / 1024))  # flat at 0.9 from step 512 on
    slow = _history(lambda s: 0.9 + (PLATEAU_GAIN / 2) * s / 1024)  # rises, but by less than PLATEAU_GAIN
    assert plateau_gain(rising, 1024) == pytest.approx(0.45 * 0.25, abs=1e-9)
    assert not probe_converged(rising, 1024, passed=False)
    assert probe_converged(plateau, 1024, passed=False)
    assert probe_converged(slow, 1024, passed=False)
    assert probe_converged(rising, 1024, passed=True)  # a pass reached the threshold
    # the row's flag is its first failing probe's; a search that never failed is not converged
    probes = [{"n_items": 20, "passed": True, "converged": True},
              {"n_items": 22, "passed": False, "converged": probe_converged(rising, 1024, False)},
              {"n_items": 21, "passed": False, "converged": probe_converged(plateau, 1024, False)}]
    assert capacity_converged(probes, 21) is True
    assert capacity_converged(probes, 22) is False
    assert capacity_converged(probes[:1], None) is False


def test_capacity_and_facts_fits_leave_out_step_limited_rows():
    n = np.array([20, 60, 190, 400])
    rows = pd.DataFrame(
        {
            "kind": ["linear"] * 5,
            "d": [8, 16, 32, 45, 45],
            "width": 0,
            "seed": [0, 0, 0, 0, 1],
            "parameters": [64, 256, 1024, 2048, 2048],
            "capacity": [*n, 100],
            "first_fail": [*(n + 1), 101],
            "converged": [True, True, True, True, False],
        }
    )  # the last row: budget-limited
    fits = capacity_fits(rows)["linear"]
    assert (
        fits["points"] == 4 and fits["step_limited"] == 1 and fits["censored"] == 0 and fits["left_out"] == 1
    )
    expected = fit_guide_constant(rows["parameters"][:4], n_log_n(n))
    assert fits["constant"].constant == pytest.approx(expected.constant, rel=1e-12)
    assert fits["seeds"] == [0, 1]
    text = capacity_markdown(rows)
    assert "| 4 | 0 / 1 |" in text and "1/2" in text  # rows fitted, left out; converged seeds at P = 2048
    facts = pd.DataFrame({"parameters": [100, 200, 400, 400], "facts": [10, 20, 40, 5], "seed": [0, 0, 0, 1],
                          "first_fail_facts": [12, 25, 48, 6], "answers_per_relation": 8,
                          "converged": ["True", "True", "True", "False"]})  # as read back from a CSV
    ffit = facts_fits(facts)
    assert ffit["points"] == 3 and ffit["step_limited"] == 1
    assert ffit["slope"].constant == pytest.approx(0.1, rel=1e-12)


def test_reference_scales_run_three_seeds():
    for config in AssocSweep(scale="reference").configs():
        assert len(config.seeds) >= 3, config.kind
    assert SCALING_PRESETS["reference"]["seeds"] == (0, 1, 2)


# ---------------------------------------------------------------- sweep unit and CLI


def test_sweep_unit_reports_a_bracketed_capacity_with_provenance():
    unit = AssocConfig(
        kind="linear", dims=(8,), seeds=(0, 1), steps=200, rel_tol=0.1, eval_every=10
    ).buckets()[0]
    rows = run_unit(run_bucket, unit)  # as the sweep runner runs it: rows stamped
    assert [r["seed"] for r in rows] == [0, 1]
    for row in rows:
        probes = row["probes"]
        passed = [p["n_items"] for p in probes if p["passed"]]
        failed = [p["n_items"] for p in probes if not p["passed"]]
        assert row["capacity"] == max(passed) and row["first_fail"] == min(failed)
        assert all(p["accuracy"] >= 0.99 for p in probes if p["passed"])
        assert 10 <= row["capacity"] < row["first_fail"] <= 2 * 64
        assert row["git_commit"] and "torch=" in row["versions"]
        assert row["parameters"] == 64 and row["d"] == 8 and row["dtype"] == "float32"
        first = [p for p in probes if p["n_items"] == row["first_fail"]]
        assert len(first) == 1 and row["converged"] == first[0]["converged"]
        assert all(p["converged"] == (p["passed"] or p["plateau_gain"] < PLATEAU_GAIN) for p in probes)


def test_cli_assoc_writes_csv_summary_and_plot(tmp_path):
    out = tmp_path / "assoc"
    code = main(["assoc", "--memory", "linear", "--dims", "6,8,10", "--seeds", "0", "--steps", "150",
                 "--rel-tol", "0.1", "--out", str(out)])
    assert code == 0
    rows = pd.read_csv(out / "capacity.csv")
    assert sorted(rows["d"]) == [6, 8, 10] and (rows["capacity"] > 0).all()
    assert (out / "capacity.png").stat().st_size > 0
    assert "fitted c" in (out / "summary.md").read_text()
    assert rows["converged"].isin([True, False]).all()
    assert capacity_markdown(rows).count("linear") >= 2


def test_cli_assoc_rejects_bad_input(tmp_path, capsys):
    assert main(["assoc", "--dims", "8,x", "--out", str(tmp_path)]) == 2
    assert "--dims takes integers like 1,2,4" in capsys.readouterr().err
    assert main(["assoc", "--scale", "papr", "--out", str(tmp_path)]) == 2
    assert "did you mean 'paper'" in capsys.readouterr().err
