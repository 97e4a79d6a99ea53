"""``audit lm``: a tiny unit runs and counts its bits right, planted cases of the count and of the plateau
report, the reader of ``audit bits``, and resume."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch.nn import functional as F

from auditor.core.errors import AuditError
from auditor.lab.bits import bits_table
from auditor.lab.experiment import run_experiment
from auditor.lab.lm.experiment import LMConfig, dataset, lm_unit, logloss_bits, plateau_table, slope_fit
from auditor.lab.lm.model import GPTShape, TinyGPT
from auditor.lab.room import get

pytestmark = pytest.mark.usefixtures("one_thread")
EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)

UNIT = {"experiment": "lm", "model": "1x8", "layers": 1, "d": 8, "heads": 1, "vocab": 16, "seq_len": 8,
        "sequences": 12, "dataset_factor": 1.0, "seed": 3, "dtype": "float32", "steps": 60, "batch_size": 4,
        "lr": 1e-2, "evals": 3, "plateau": 0.01, "device": "cpu"}


def test_the_parameter_count_is_the_models():
    for layers, d, heads in ((1, 8, 1), (2, 32, 2), (3, 48, 3)):
        shape = GPTShape(layers, d, heads, vocab=50, seq_len=10)
        model = TinyGPT(shape, torch.Generator().manual_seed(0))
        assert sum(p.numel() for p in model.parameters()) == shape.parameters
    assert GPTShape(1, 24, 1, 128, 32).parameters == 11_136  # the reference's smallest model


def test_a_tiny_unit_runs_and_counts_entropy_less_its_log_loss():
    row = lm_unit(dict(UNIT))[0]
    assert row["entropy_bits"] == 12 * 8 * 4.0  # n S log2 V, V = 16
    expected = max(0.0, row["entropy_bits"] - row["logloss_bits"])
    # memorized and log-loss are each rounded to 3 decimals (5e-4 each), the difference rounds once more
    rounding = 2 * 5e-4 + 2 * EPS64 * row["entropy_bits"]
    assert row["memorized_bits"] == pytest.approx(expected, abs=rounding)
    assert 0 < row["memorized_bits"] <= row["entropy_bits"]  # 60 steps on 12 sequences: something is stored
    # each sequence clipped at 0 before the sum (Morris et al.) never counts less than the total clipped once
    assert row["memorized_bits"] - rounding <= row["memorized_bits_per_sequence"] <= row["entropy_bits"]
    # bits_per_parameter divides the unrounded count: the rounded one is 5e-4 bits away at most
    per_parameter = (5e-4 + 2 * EPS64 * row["entropy_bits"]) / row["parameters"]
    stored = row["memorized_bits"] / row["parameters"]
    assert row["bits_per_parameter"] == pytest.approx(stored, abs=per_parameter)
    assert [h["step"] for h in row["history"]] == [20, 40, 48, 60]  # evals, and the start of the last fifth
    assert row["converged"] == (row["final_gain"] < 0.01)
    again = lm_unit(dict(UNIT))[0]  # seeded: the same unit gives the same row
    assert again["logloss_bits"] == row["logloss_bits"]
    half = lm_unit({**UNIT, "dtype": "bfloat16"})[0]
    assert half["entropy_bits"] == row["entropy_bits"] and half["logloss_bits"] != row["logloss_bits"]


def test_the_code_length_is_the_log_loss_in_bits_and_a_uniform_model_stores_nothing():
    shape = GPTShape(1, 8, 2, vocab=16, seq_len=8)
    data = dataset({**UNIT, "sequences": 20})
    model = TinyGPT(shape, torch.Generator().manual_seed(1))
    # against an independent float64 count: -sum log2 softmax(logits)[token]
    with torch.no_grad():
        logp = F.log_softmax(model(data).double(), dim=-1)  # (n, S, V)
        direct = -float(logp.gather(2, data[..., None]).sum()) / math.log(2)
    tokens = data.numel()
    assert logloss_bits(model, data, batch=7) == pytest.approx(direct, rel=8 * EPS32 * math.log2(tokens))
    # planted: every weight 0 -> every logit 0 -> the uniform distribution, log-loss = n S log2 V exactly
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    entropy = tokens * math.log2(16)
    code = logloss_bits(model, data)
    assert code == pytest.approx(entropy, rel=4 * EPS32 * math.log2(tokens))
    from auditor.lab.information import logloss_stored_bits

    assert float(logloss_stored_bits(entropy, code)[0]) <= 4 * EPS32 * math.log2(tokens) * entropy


def _planted(alpha: dict[str, float]) -> pd.DataFrame:
    """Rows whose memorized bits rise with the data, then sit at alpha x parameters (the planted plateau)."""
    rows = []
    for model, parameters in (("a", 1000), ("b", 4000)):
        for dtype, a in alpha.items():
            for seed in (0, 1, 2):
                for sequences, entropy in ((10, 0.5 * a * parameters), (20, 2 * a * parameters),
                                           (40, 4 * a * parameters)):
                    stored = min(entropy, a * parameters) * (1 + 0.01 * (seed - 1))
                    rows.append({"model": model, "parameters": parameters, "dtype": dtype, "seed": seed,
                                 "sequences": sequences, "entropy_bits": entropy, "memorized_bits": stored,
                                 "converged": True, "steps": 100})
    return pd.DataFrame(rows)


def test_the_plateau_and_the_slope_recover_a_planted_capacity():
    frame = _planted({"float32": 3.6, "bfloat16": 3.5})
    table = plateau_table(frame).set_index(["model", "dtype"])
    for model in ("a", "b"):
        for dtype, a in (("float32", 3.6), ("bfloat16", 3.5)):
            row = table.loc[(model, dtype)]
            assert row["bits_per_parameter"] == pytest.approx(a)  # seeds at -1%, 0, +1%: mean a
            assert row["ci_low"] < a < row["ci_high"] and row["capacity_limited"]
            assert row["sequences"] == 20  # the first size past the plateau (the larger one ties)
    slope, low, high, points = slope_fit(frame, "float32")
    assert points == 6 and slope == pytest.approx(3.6, rel=0.011) and low < 3.6 < high
    # a model that stored all of every dataset shows no capacity yet: left out of the fit, marked in the table
    unbounded = frame[frame["model"] == "b"].assign(model="c", parameters=9000)
    unbounded["memorized_bits"] = 0.99 * unbounded["entropy_bits"]
    both = pd.concat([frame, unbounded], ignore_index=True)
    assert slope_fit(both, "float32") == (slope, low, high, points)
    assert not plateau_table(both).set_index(["model", "dtype"]).loc[("c", "float32"), "capacity_limited"]


def test_a_model_still_at_chance_has_not_converged():
    """A unit that stored nothing did not gain because it has not begun (rows of the committed reference at
    600 steps of 814k parameters): no plateau, in the summary and in ``audit bits``, whatever the row says."""
    from auditor.lab.lm.bits import lm_bits

    frame = _planted({"float32": 3.6})
    idle = frame[frame["model"] == "b"].assign(model="c", parameters=9000, memorized_bits=0.0)
    both = pd.concat([frame, idle], ignore_index=True)  # "converged": True on every row, as recorded
    table = plateau_table(both).set_index(["model", "dtype"])
    idle_row = table.loc[("c", "float32")]
    assert idle_row["converged"] == 0 and not idle_row["capacity_limited"]
    assert table.loc[("a", "float32"), "converged"] == 3  # the others unchanged
    assert slope_fit(both, "float32") == slope_fit(frame, "float32")
    rows = idle.assign(tokens=64, vocab=16, logloss_bits=64 * 4.0, sequences=8)  # at chance: H = log-loss
    counted = lm_bits(rows)
    assert (counted["stored_bits"] == 0).all() and not counted["converged"].any()


def test_bad_settings_are_one_line_errors():
    with pytest.raises(AuditError, match="LAYERSxWIDTH"):
        LMConfig(models=("2-64",))
    with pytest.raises(AuditError, match="training precision"):
        LMConfig(dtypes=("float16",))
    with pytest.raises(AuditError, match="multiple of heads"):
        LMConfig(models=("1x10x3",), steps=(100,), lr=(1e-2,)).units()


def test_steps_and_rates_are_one_for_all_or_one_per_model():
    from auditor.lab.lm.experiment import REFERENCE_LR, REFERENCE_MODELS, REFERENCE_STEPS

    units = LMConfig(dataset_factors=(1.0,), seeds=(0,), dtypes=("float32",)).units()
    assert [(u["model"], u["steps"], u["lr"]) for u in units] == list(
        zip(REFERENCE_MODELS, REFERENCE_STEPS, REFERENCE_LR))
    # a subset of the reference's models keeps each model's own budget, in the order given
    picked = LMConfig(models=("2x64", "1x24"))
    assert picked.steps == (REFERENCE_STEPS[2], REFERENCE_STEPS[0]) and picked.lr == (REFERENCE_LR[2],
                                                                                      REFERENCE_LR[0])
    assert {u["steps"] for u in LMConfig(models=("1x8", "1x16"), steps=(70,), lr=(1e-2,)).units()} == {70}
    with pytest.raises(AuditError, match="one per model"):
        LMConfig(models=("1x8",))  # not a reference model: its budget must be given
    with pytest.raises(AuditError, match="one per model"):
        LMConfig(models=("1x8", "1x16"), steps=(10, 20, 30), lr=(1e-2,))


def test_the_command_line_keeps_repeated_per_model_values():
    from auditor.lab.cli import parse
    from auditor.lab.experiment import Option

    experiment = get("lm")
    options = {o.field.name: o for o in experiment.options()}
    assert isinstance(options["steps"], Option)
    assert parse(options["steps"], "600,600,300") == (600, 600, 300)  # one per model: repeats kept
    assert parse(options["lr"], "1e-2,1e-2") == (1e-2, 1e-2)
    assert parse(options["seeds"], "0,0,1") == (0, 1)  # a set of seeds: repeats dropped
    with pytest.raises(AuditError, match="--steps takes values in 1..10000000"):
        parse(options["steps"], "0")


def test_a_quick_run_is_counted_by_audit_bits_and_resumes(tmp_path):
    experiment = get("lm")
    config = experiment.make("quick")
    frame, text = run_experiment(experiment, config, tmp_path, plots=True, progress=False)
    assert len(frame) == 8 and (tmp_path / "memorized.png").stat().st_size > 0
    assert "float32: capacity =" in text and (tmp_path / "summary.csv").exists()
    table = bits_table([tmp_path / "results.csv"])
    assert set(table["experiment"]) == {"lm float32", "lm bfloat16"}
    # recounted from the rounded log-loss against the rounded memorized bits: 5e-4 each, one subtraction
    rounding = 2 * 5e-4 + 2 * EPS64 * float(frame["entropy_bits"].max())
    assert table["stored_bits"].to_numpy() == pytest.approx(frame["memorized_bits"].to_numpy(), abs=rounding)
    assert (table["stored_bits"] <= table["entropy_bits"]).all()
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "units").glob("*.json")}
    again, _ = run_experiment(experiment, config, tmp_path, plots=False, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "units").glob("*.json")} == stamps  # none rerun
    assert again["logloss_bits"].tolist() == frame["logloss_bits"].tolist()
