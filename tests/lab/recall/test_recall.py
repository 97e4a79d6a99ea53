"""Capacity lab III, factual recall: the generator, the one-layer transformer, the sweeps, the learning
dynamics and the stage detector."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import forward_atol

from auditor.cli import main
from auditor.core.errors import AuditError
from auditor.lab.common.search.convergence import accuracy_at
from auditor.lab.common.search.summary import budget_fit
from auditor.lab.engine import TrainConfig, train
from auditor.lab.recall.dynamics import DynamicsConfig, LinearAttentionOneHot, run_dynamics
from auditor.lab.recall.model import RecallMember, build_recall, recall_parameters
from auditor.lab.recall.scaling import SCALING_KEYS, ScalingConfig, grid_sizes, run_scaling_unit, table_shape
from auditor.lab.recall.stages import detect_stages, find_plateau
from auditor.lab.recall.task import FactBank, FactTable, member_generator
from auditor.lab.recall.tradeoff import TradeoffConfig, run_tradeoff_unit
from auditor.lab.recall.training import RecallTraining, outcome_at, train_models
from auditor.lab.sweep import key_fields, run_unit

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def _gens(*seeds, stream=1, step=0):
    return [member_generator(s, stream, step) for s in seeds]


# ---------------------------------------------------------------- generator


def test_fact_table_is_consistent_across_calls_with_the_same_seed():
    table = FactTable(20, 6, 8, seed=11)
    a, b = table.answers(), FactTable(20, 6, 8, seed=11).answers()
    assert torch.equal(a, b) and torch.equal(a, table.answers())
    assert not torch.equal(a, FactTable(20, 6, 8, seed=12).answers())
    block = a // 8
    assert torch.equal(block, torch.arange(6).expand(20, 6))  # a(s, r) lies in relation r's block
    assert table.num_facts == 120 and table.num_answers == 48 and table.vocab_size == 53
    assert table.bits() == pytest.approx(120 * 3)


def test_structured_table_follows_the_formula():
    answers = FactTable(16, 4, 8, structured=True).answers()
    for s in range(16):
        for r in range(4):
            assert answers[s, r] == (s * 8) // 16 + r * 8


def test_prompts_hold_subject_relation_noise_and_eos():
    tables = [FactTable(5, 3, 4, seed=0), FactTable(9, 7, 2, seed=1)]
    bank = FactBank(tables, prompt_length=12)
    batch = bank.sample(200, _gens(0, 1))
    assert batch.tokens.shape == (2, 200, 12)
    for i, t in enumerate(tables):
        S, R = t.subjects, t.relations
        tok = batch.tokens[i]
        assert torch.all(tok[:, -1] == t.eos_token)
        body = tok[:, :-1]
        is_subject, is_relation = body < S, (body >= S) & (body < S + R)
        assert torch.all(is_subject.sum(1) == 1) and torch.all(is_relation.sum(1) == 1)
        assert torch.all((body >= S + R) | is_subject | is_relation) and torch.all(body < 2 * (S + R))
        subject = (body * is_subject).sum(1)
        relation = (body * is_relation).sum(1) - S
        assert torch.equal(subject, batch.subjects[i]) and torch.equal(relation, batch.relations[i])
        assert torch.equal(batch.answers[i], t.answers()[subject, relation])


def test_all_facts_covers_every_fact_k_times():
    tables = [FactTable(4, 3, 8, seed=0), FactTable(6, 5, 8, seed=0)]
    batch = FactBank(tables).all_facts(3, _gens(0, 1, stream=2))
    for i, t in enumerate(tables):
        valid = batch.valid[i]
        assert int(valid.sum()) == t.num_facts * 3
        pairs = batch.subjects[i][valid] * t.relations + batch.relations[i][valid]
        assert torch.equal(torch.bincount(pairs, minlength=t.num_facts), torch.full((t.num_facts,), 3))


def test_a_members_prompts_do_not_depend_on_its_ensemble():
    alone = FactBank([FactTable(7, 4, 8, seed=3)]).sample(64, _gens(5, step=9))
    together = FactBank([FactTable(30, 2, 8, seed=0), FactTable(7, 4, 8, seed=3)]).sample(
        64, _gens(1, 5, step=9)
    )
    assert torch.equal(alone.tokens[0], together.tokens[1])
    assert torch.equal(alone.answers[0], together.answers[1])


# ---------------------------------------------------------------- model


def _members(**overrides):
    base = {"d": 16, "heads": 3, "head_dim": 4, "width": 0, "facts": FactTable(5, 4, 8, seed=0), "seed": 0}
    return RecallMember(**{**base, **overrides})


def _chain(members, context: int) -> int:
    """Summed lengths of the reductions one EOS feature goes through (scores over d and d_h, softmax and
    pooling over the context, the H d output projection, the MLP over d and m): the width for
    ``forward_atol`` of two evaluations that sum in different orders."""
    m = max(member.width for member in members)
    d = max(member.d for member in members)
    heads = max(member.heads for member in members)
    head_dim = max(member.head_dim for member in members)
    return d + head_dim + 2 * context + heads * d + d + m


def test_fast_features_equal_the_literal_attention():
    members = [_members(width=0, seed=0), _members(width=12, seed=1, facts=FactTable(8, 3, 4, seed=2))]
    model, task = build_recall(members, batch_size=32)
    tokens = task.batch(0, torch.Generator()).tokens
    fast = model.features(tokens)
    atol = forward_atol(fast, _chain(members, tokens.shape[-1]))
    torch.testing.assert_close(fast, model.features_reference(tokens), atol=atol, rtol=0)


def test_no_positions_means_the_order_of_the_context_does_not_matter():
    model, task = build_recall([_members(width=8)], batch_size=16)
    tokens = task.batch(0, torch.Generator()).tokens
    shuffled = tokens.clone()
    shuffled[..., :-1] = tokens[..., torch.randperm(tokens.shape[-1] - 1)]
    logits = model(tokens)
    # the permuted sums differ only in summation order: + the d-long read-out
    atol = forward_atol(logits, _chain([_members(width=8)], tokens.shape[-1]) + 16)
    torch.testing.assert_close(logits, model(shuffled), atol=atol, rtol=0)


def test_parameter_count_matches_the_trainable_tensors():
    member = _members(d=12, heads=5, head_dim=3, width=7)
    model, _ = build_recall([member])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == member.parameters + 7  # + the m biases
    assert member.parameters == recall_parameters(12, 5, 3, 7) == 4 * 5 * 3 * 12 + 2 * 7 * 12
    with pytest.raises(AuditError, match="rounds to 0"):
        _members(head_dim=0)


def test_padded_members_match_the_same_member_alone():
    small = _members(width=4, seed=7, facts=FactTable(3, 2, 8, seed=7))
    big = _members(width=16, seed=8, facts=FactTable(9, 6, 8, seed=8))
    model, task = build_recall([small, big], batch_size=64)
    alone, alone_task = build_recall([small], batch_size=64)
    tokens = task.batch(0, torch.Generator()).tokens
    a_tokens = alone_task.batch(0, torch.Generator()).tokens
    assert torch.equal(tokens[0], a_tokens[0])
    logits = model(tokens)[0, :, : small.facts.num_answers]
    width = _chain([big], tokens.shape[-1]) + big.d  # padded to the widest member, + the d-long read-out
    torch.testing.assert_close(logits, alone(a_tokens)[0], atol=forward_atol(logits, width), rtol=0)
    cfg = TrainConfig(steps=30, lr=1e-2, optimizer="adamw", warmup_frac=0.0, schedule="constant",
                      early_stop=False, eval_every=10)
    train(model, task, cfg, progress=False)
    train(alone, alone_task, cfg, progress=False)
    # first order: each of the steps adds at most one forward/backward rounding (width eps relative to
    # the parameters' scale) to the difference, and the differences add up across steps
    for got, want in ((model.w_v[0], alone.w_v[0]), (model.w_1[0, :, :4], alone.w_1[0])):
        torch.testing.assert_close(got, want, atol=cfg.steps * forward_atol(want, width), rtol=0)
    assert torch.all(model.w_1[0, :, 4:] == 0)  # padded hidden units never move


def test_training_stores_a_small_fact_table_and_accuracy_is_over_all_facts():
    member = _members(d=24, heads=4, head_dim=4, width=24, facts=FactTable(6, 6, 4, seed=1))
    model, task = build_recall([member], batch_size=256, eval_contexts=3)
    result = train(
        model,
        task,
        TrainConfig(
            steps=800,
            lr=1e-2,
            optimizer="adamw",
            warmup_frac=0.0,
            schedule="constant",
            target_accuracy=1.0,
            eval_every=25,
        ),
        progress=False,
    )
    assert result.accuracy.item() == 1.0 and result.steps_trained.item() < 800
    assert task.fact_recall(model).item() == 1.0
    # the evaluation set is every fact in 3 contexts, and accuracy is their mean
    assert int(task.eval_set.valid.sum()) == 36 * 3
    manual = (model(task.eval_set.tokens).argmax(-1) == task.eval_set.answers).double().mean()
    assert task.accuracy(model).item() == pytest.approx(manual.item())


def test_fact_recall_is_at_most_the_prompt_accuracy():
    model, task = build_recall([_members(seed=s) for s in range(3)], batch_size=8)
    assert torch.all(task.fact_recall(model) <= task.accuracy(model) + 1e-12)


# ---------------------------------------------------------------- sweeps


_TINY = RecallTraining(steps=120, batch_size=64, eval_every=20, eval_contexts=2, prompt_length=8)


def test_tradeoff_unit_rows_describe_every_cell():
    unit = TradeoffConfig(subjects=4, relations=4, d=16, head_dim=4, heads=(2,), widths=(0, 8), seeds=(0, 1),
                          training=_TINY).units()[0]
    rows = pd.DataFrame(run_unit(run_tradeoff_unit, unit))  # as the sweep runner runs it: rows stamped
    assert len(rows) == 4 and set(rows["width"]) == {0, 8} and set(rows["seed"]) == {0, 1}
    assert (rows["parameters"] == rows["attention_parameters"] + rows["mlp_parameters"]).all()
    assert rows["accuracy"].between(0, 1).all() and (rows["stored"] == (rows["accuracy"] >= 0.99)).all()
    assert {
        "git_commit",
        "versions",
        "lrs",
        "best_lr",
        "batch_size",
        "prompt_length",
        "answers_per_relation",
        "dtype",
        "device",
    } <= set(rows.columns)


def test_each_model_keeps_its_best_learning_rate():
    tiny = RecallTraining(steps=300, batch_size=128, eval_every=25, eval_contexts=2, lrs=(1e-6, 2e-2))
    member = _members(d=16, heads=4, head_dim=4, width=16, facts=FactTable(3, 3, 4, seed=2))
    (both,) = train_models([member], tiny)
    (alone,) = train_models([member], dataclasses.replace(tiny, lrs=(2e-2,)))
    by_lr = both["accuracy_by_lr"]
    assert both["best_lr"] == 2e-2 and both["passed"] and by_lr["1e-06"] < 0.5
    assert both["accuracy"] == alone["accuracy"] and both["steps_trained"] == alone["steps_trained"]


def test_scaling_unit_brackets_the_largest_table():
    unit = ScalingConfig(dims=(8,), head_dim=2, attn_ratio=1.0, width_ratios=(1.0,), seeds=(0,),
                         training=_TINY).units()[0]
    (row,) = run_scaling_unit(unit)
    assert row["heads"] == 4 and row["width"] == 8 and row["parameters"] == 4 * 4 * 2 * 8 + 2 * 8 * 8
    assert row["facts"] == row["subjects"] * row["relations"] and row["subjects"] - row["relations"] in (0, 1)
    probes = row["probes"]
    assert row["facts"] == max([p["facts"] for p in probes if p["passed"]], default=0)
    if row["first_fail_facts"] is not None:
        assert row["facts"] < row["first_fail_facts"] == min(p["facts"] for p in probes if not p["passed"])
    assert row["bits_per_parameter"] == pytest.approx(row["facts"] * 3 / row["parameters"])
    with pytest.raises(AuditError, match="H must be >= 1"):
        ScalingConfig(dims=(4,), head_dim=8, attn_ratio=0.5)


def test_table_shapes_grow_monotonically():
    shapes = [table_shape(k) for k in range(2, 40)]
    facts = [s * r for s, r in shapes]
    assert shapes[:4] == [(1, 1), (2, 1), (2, 2), (3, 2)]
    assert all(b > a for a, b in zip(facts, facts[1:]))
    with pytest.raises(AuditError):
        table_shape(1)


# ---------------------------------------------------------------- learning dynamics


def test_linear_attention_fast_path_equals_one_hot_products():
    model = LinearAttentionOneHot(2, vocab_size=11, num_answers=6, eos_token=10, init=0.0)
    with torch.no_grad():
        model.attention.normal_()
        model.readout.normal_()
    tokens = torch.randint(11, (2, 5, 7))
    torch.testing.assert_close(model(tokens), model.forward_reference(tokens))


def test_dynamics_pass_through_the_hallucination_stage():
    # the paper's setting with a 5x larger step (time rescaled) and smaller batches, to run in seconds
    config = DynamicsConfig(lr=0.5, steps=1400, batch_size=128, eval_every=20, eval_contexts=4, seeds=(0,))
    curves, stages = run_dynamics(config, progress=False)
    row = stages.iloc[0]
    assert row["uniform_end"] is not None and not math.isnan(row["uniform_end"])
    assert row["uniform_end"] < row["hallucination_start"] < row["hallucination_end"] < row["converged_at"]
    assert bool(row["hallucination_confirmed"])  # relation known, subject not
    assert abs(row["hallucination_mean"] - math.log(8)) < 0.15
    first = curves.iloc[0]
    assert first["loss"] == pytest.approx(math.log(32), abs=1e-3)  # tiny init: uniform over R D answers
    assert {"git_commit", "versions", "lr", "init", "optimizer"} <= set(curves.columns)


@pytest.mark.slow
def test_dynamics_at_the_papers_setting():
    curves, stages = run_dynamics(DynamicsConfig(seeds=(0,)), progress=False)
    row = stages.iloc[0]
    assert row["uniform_end"] < row["hallucination_start"] < row["hallucination_end"] < row["converged_at"]
    assert bool(row["hallucination_confirmed"])
    assert curves["loss"].iloc[-1] < 0.05


# ---------------------------------------------------------------- stage detection


def _synthetic(noise=0.02, with_hallucination=True, seed=0):
    """A loss curve with plateaus at ln 32 on [0, 1000], at ln 8 on [1300, 3000], converging by ~3700."""
    steps = np.arange(0, 6001, 20)
    hi, mid = math.log(32), math.log(8)
    down1 = 1 / (1 + np.exp(-(steps - 1150) / 30))
    down2 = 1 / (1 + np.exp(-(steps - 3300) / 60))
    if with_hallucination:
        loss = hi - (hi - mid) * down1 - mid * down2
    else:
        loss = hi - hi * down1
    loss = loss + np.random.default_rng(seed).normal(0, noise, len(steps))
    relation = np.log(4) * (1 - down1) + 0.005
    return steps, np.clip(loss, 1e-4, None), relation


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stage_detection_finds_known_plateaus(seed):
    steps, loss, relation = _synthetic(seed=seed)
    stages = detect_stages(steps, loss, num_answers=32, answers_per_relation=8, relation_loss=relation)
    b = stages.boundaries()
    # the band is 10% of the level: the sigmoid leaves it ~60 steps after its centre... within 2 * 60
    assert 1000 <= b["uniform_end"] <= 1150
    assert 1150 <= b["hallucination_start"] <= 1300
    assert 3000 <= b["hallucination_end"] <= 3250
    assert 3300 <= b["converged_at"] <= 3700
    assert stages.hallucination_confirmed and stages.relation_loss_mid < 0.02


def test_stage_detection_reports_missing_stages():
    steps, loss, relation = _synthetic(with_hallucination=False)
    stages = detect_stages(steps, loss, num_answers=32, answers_per_relation=8, relation_loss=relation)
    assert stages.uniform is not None and stages.hallucination is None and not stages.hallucination_confirmed
    assert stages.converged_at is not None
    flat = detect_stages(steps, np.full(len(steps), math.log(32)), num_answers=32, answers_per_relation=8)
    assert flat.hallucination is None and flat.converged_at is None and flat.uniform.start == 0


def test_plateau_needs_enough_points_and_valid_input():
    steps = np.arange(10)
    loss = np.array([3.0, 3.0, 2.0, 2.0, 2.0, 2.0, 1.0, 2.0, 2.0, 1.0])
    plateau = find_plateau(steps, loss, 2.0, band=0.05, window=1, min_points=3)
    assert (plateau.start, plateau.end) == (2, 5)
    assert find_plateau(steps, loss, 2.0, band=0.05, window=1, min_points=5) is None
    with pytest.raises(AuditError, match="increasing"):
        find_plateau(steps[::-1], loss, 2.0)
    with pytest.raises(AuditError, match="NaN"):
        find_plateau(steps, np.full(10, np.nan), 2.0)
    with pytest.raises(AuditError, match="overlap"):
        detect_stages(steps, loss, num_answers=9, answers_per_relation=8, band=0.1)


def test_cli_recall_dynamics_and_errors(tmp_path, capsys):
    out = tmp_path / "recall"
    assert (
        main(["recall", "dynamics", "--steps", "200", "--seeds", "0", "--lr", "0.5", "--out", str(out)]) == 0
    )
    stages = pd.read_csv(out / "dynamics_stages.csv")
    assert list(stages["seed"]) == [0]
    assert (out / "dynamics.png").stat().st_size > 0 and (out / "dynamics_curves.csv").exists()
    assert "plateau levels" in (out / "dynamics.md").read_text()
    assert main(["recall", "tradeoff", "--seeds", "a", "--out", str(out)]) == 2
    assert "--seeds takes integers like 1,2,4" in capsys.readouterr().err


# ---------------------------------------------------------------- budgets and convergence


def _history(accuracies, every=10):
    return pd.DataFrame({"step": [every * i for i in range(len(accuracies))], "accuracy": accuracies})


def test_outcome_at_a_budget_reads_the_run_up_to_that_budget():
    run = _history([0.1, 0.5, 0.8, 0.9, 0.95, 0.995, 0.995])  # passes at step 50
    at40, at60 = outcome_at(run, 40, 0.99), outcome_at(run, 60, 0.99)
    assert at40 == {
        "accuracy": 0.95,
        "passed": False,
        "converged": False,
        "steps_trained": 40,
    }  # +0.15 over 30..40
    assert at60 == {"accuracy": 0.995, "passed": True, "converged": True, "steps_trained": 50}
    flat = _history([0.1, 0.6, 0.7, 0.7, 0.7, 0.705, 0.705, 0.705, 0.705])  # gain < PLATEAU_GAIN over 60..80
    assert outcome_at(flat, 80, 0.99)["converged"] and not outcome_at(flat, 80, 0.99)["passed"]
    assert accuracy_at(flat, 85) == 0.705
    with pytest.raises(AuditError, match="no evaluation"):
        accuracy_at(flat.iloc[1:], 5)


def test_a_budget_reports_what_a_run_stopped_there_reports():
    tr = RecallTraining(steps=80, batch_size=64, eval_every=8, eval_contexts=2, lrs=(3e-2,))
    models = [_members(d=8, heads=4, head_dim=2, width=w, facts=FactTable(s, r, 4, seed=1)) for w, s, r in
              ((0, 2, 2), (8, 4, 3), (0, 5, 5))]
    long = train_models(models, tr, budgets=(40, 80))
    short = train_models(models, dataclasses.replace(tr, steps=40))
    for by_budget, alone in zip(long, short):
        assert set(by_budget) == {40, 80}
        for key in ("accuracy", "passed", "steps_trained", "converged"):
            assert by_budget[40][key] == alone[key], key
        assert by_budget[80]["passed"] >= by_budget[40]["passed"]


def test_budget_mode_rows_one_per_budget_capacity_never_falls():
    unit = ScalingConfig(
        dims=(8,),
        head_dim=2,
        attn_ratio=1.0,
        width_ratios=(0.0,),
        seeds=(0,),
        budgets=(24, 48),
        grid=(0.02, 0.08),
        training=RecallTraining(steps=48, batch_size=64, eval_every=8, eval_contexts=2, lrs=(3e-2,)),
    ).units()[0]
    rows = pd.DataFrame(run_unit(run_scaling_unit, unit))
    assert list(rows["budget"]) == [24, 48] and rows["converged"].dtype == bool
    assert rows["facts"].is_monotonic_increasing
    sizes = grid_sizes(256, (0.02, 0.08))
    for _, row in rows.iterrows():
        assert [p["subjects"] + p["relations"] for p in row["probes"]] == sizes
        passed = [p["facts"] for p in row["probes"] if p["passed"]]
        assert row["facts"] <= max(passed, default=0)
        if row["first_fail_facts"] is None:
            assert not row["converged"]  # the top of the grid: not bracketed


def test_grid_and_budget_options_are_checked():
    assert grid_sizes(256, (0.05, 0.2)) == list(range(7, 16))  # 2 sqrt(12.8) = 7.2 .. 2 sqrt(51.2) = 14.3
    tr = RecallTraining(steps=100, eval_every=10)
    with pytest.raises(AuditError, match="multiples of --eval-every"):
        ScalingConfig(budgets=(25, 100), training=tr)
    with pytest.raises(AuditError, match="no larger than --steps"):
        ScalingConfig(budgets=(50, 200), training=tr)
    with pytest.raises(AuditError, match="two facts-per-parameter values"):
        ScalingConfig(budgets=(50,), grid=(0.2, 0.1), training=tr)
    unit = ScalingConfig(training=tr).units()[0]
    assert "budgets" not in key_fields(unit, SCALING_KEYS)  # at its default: left out of a bisection's key


def test_budget_fit_recovers_a_known_saturating_curve():
    budgets = np.array([1000, 2000, 4096, 8192, 16384] * 2)
    rows = pd.DataFrame(
        {"budget": budgets, "facts": 1, "facts_per_parameter": 0.2 * budgets / (budgets + 3000.0)}
    )
    fit = budget_fit(rows)
    assert fit.ceiling == pytest.approx(0.2, rel=1e-6) and fit.half_budget == pytest.approx(3000, rel=1e-6)
    assert fit.budget_for(0.15) == pytest.approx(9000, rel=1e-6) and fit.budget_for(0.3) == math.inf
    assert budget_fit(rows[rows["budget"] == 1000]) is None  # one budget: no curve


def test_cli_tradeoff_grid_options_and_converged_column(tmp_path):
    out = tmp_path / "tradeoff"
    assert (
        main(
            [
                "recall",
                "tradeoff",
                "--scale",
                "quick",
                "--heads",
                "1:2",
                "--widths",
                "0,4",
                "--steps",
                "20",
                "--eval-every",
                "10",
                "--no-plots",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = pd.read_csv(out / "tradeoff.csv")
    assert sorted(set(rows["heads"])) == [1, 2] and sorted(set(rows["width"])) == [0, 4]
    assert rows["converged"].dtype == bool and (rows["eval_every"] == 10).all()
    assert main(["recall", "tradeoff", "--heads", "0,1", "--out", str(tmp_path / "bad")]) == 2


def _tradeoff_rows(seeds=(0, 1, 2)) -> pd.DataFrame:
    """A 2 x 2 grid as the CSV holds it (flags as text): H = 2 stores from m = 8 (seed 2 from m = 16)."""
    rows = []
    for heads in (1, 2):
        for width in (8, 16):
            for seed in seeds:
                stored = heads == 2 and (width == 16 or seed != 2)
                accuracy = 1.0 if stored else 0.3 + 0.1 * heads + 0.01 * seed
                rows.append(
                    {
                        "subjects": 4,
                        "relations": 4,
                        "facts": 16,
                        "d": 8,
                        "heads": heads,
                        "head_dim": 2,
                        "width": width,
                        "seed": seed,
                        "parameters": 100 * heads + width,
                        "accuracy": accuracy,
                        "stored": str(stored),
                        "converged": str(stored or width == 8),
                        "steps": 50,
                    }
                )
    return pd.DataFrame(rows)


def test_tradeoff_report_aggregates_seeds_with_intervals_and_step_limited_counts(tmp_path):
    from auditor.lab.common.search.plots import plot_tradeoff
    from auditor.lab.common.search.summary import smallest_storing_width, tradeoff_cells, tradeoff_markdown
    from auditor.lab.stats import mean_ci

    rows = _tradeoff_rows()
    cells = tradeoff_cells(rows).set_index(["heads", "width"])
    mean, low, high = mean_ci([0.4, 0.41, 0.42])
    assert cells.loc[(1, 8), ["accuracy_mean", "accuracy_low", "accuracy_high"]].tolist() == pytest.approx(
        [mean, low, high]
    )
    assert cells.loc[(1, 8), "accuracy_half_width"] == pytest.approx((high - low) / 2)
    assert cells.loc[(2, 16), "accuracy_half_width"] == 0 and cells.loc[(2, 16), "stored"] == 3
    assert cells["step_limited"].tolist() == [0, 3, 0, 0]  # "False" read from a CSV is False
    assert smallest_storing_width(rows).loc[2].tolist() == [8, 8, 16]
    assert smallest_storing_width(rows).loc[1].isna().all()
    text = tradeoff_markdown(rows)
    assert "mean over 3 seeds" in text and "half-width of the 95% Student-t interval" in text
    assert (
        "- H = 2: smallest width storing all facts at the threshold, per seed (0, 1, 2): 8, 8, 16; mean 11"
        in text
    )
    assert (
        "in all 3 seeds: m = 16" in text
        and "3 of 12 runs (seed 0: 1 of 4; seed 1: 1 of 4; seed 2: 1 of 4)" in text
    )
    assert plot_tradeoff(rows, tmp_path / "three.png").stat().st_size > 0
    one = _tradeoff_rows(seeds=(0,))
    text = tradeoff_markdown(one)
    assert (
        "half-width" not in text
        and "- H = 2: smallest width storing all facts at the threshold: m = 8" in text
    )
    assert plot_tradeoff(one, tmp_path / "one.png").stat().st_size > 0  # no interval panel, no error
