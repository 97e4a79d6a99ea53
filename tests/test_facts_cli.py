"""Facts room from the shell and as sweeps: `audit facts ...`, resumable units, provenance, plots."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from auditor.cli import main
from auditor.lab.facts.experiments import check_configs, unit_function
from auditor.lab.facts.presets import sweep_units
from auditor.lab.sweep import run_sweep

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def test_generate_then_rank(tmp_path, capsys):
    db = tmp_path / "db.csv"
    assert (
        main(
            [
                "facts",
                "generate",
                "--kind",
                "planted",
                "--keys",
                "12",
                "--queries",
                "4",
                "--key-groups",
                "3",
                "--query-groups",
                "2",
                "-o",
                str(db),
            ]
        )
        == 0
    )
    assert len(pd.read_csv(db)) == 48
    out = tmp_path / "rank.csv"
    assert main(["facts", "rank", str(db), "--threads", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "exact_rank" in printed and "cp_rank" in printed
    row = pd.read_csv(out).iloc[0]
    assert row["exact_rank"] == 6 and row["cp_rank"] == 6 and row["paper_bound"] == 12
    assert {"git_commit", "versions"} <= set(row.index)


def test_rank_reports_a_clash_as_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "clash.csv"
    pd.DataFrame({"key": ["a", "a"], "query": ["r", "r"], "value": ["x", "y"]}).to_csv(path, index=False)
    assert main(["facts", "rank", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: not a partial function: ('a', 'r') has two values") and err.count("\n") == 1
    assert main(["facts", "rank", str(path), "--key-col", "subject"]) == 2
    assert "unknown column 'subject'" in capsys.readouterr().err


def test_train_command_with_layer_rank(tmp_path):
    db = tmp_path / "db.csv"
    assert (
        main(["facts", "generate", "--keys", "6", "--queries", "3", "--values-per-query", "2", "-o", str(db)])
        == 0
    )
    out = tmp_path / "run"
    assert (
        main(
            [
                "facts",
                "train",
                str(db),
                "--d-model",
                "4",
                "--d-vo",
                "1:4",
                "--budget",
                "--steps",
                "30",
                "--layer-rank",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    frame = pd.read_csv(out / "results.csv")
    assert list(frame["d_vo"]) == [1, 2, 3, 4] and list(frame["d_qk"]) == [4, 3, 2, 1]
    assert (frame["flattening_lower"] <= frame["bound"]).all() and (frame["cp_rank"] <= frame["bound"]).all()
    assert (frame["construction_residual"] < 1e-8).all()
    assert main(["facts", "train", str(db), "--d-model", "4", "--d-vo", "5", "--budget"]) == 2


def test_width_sweep_runs_resumes_and_plots(tmp_path):
    out = tmp_path / "width"
    assert main(["facts", "sweep", "width", "--quick", "--out", str(out)]) == 0
    frame = pd.read_csv(out / "results.csv")
    assert len(frame) == 4  # quick grid: d_model in (2, 4) x d_vo in (1, 2)
    for column in (
        "accuracy",
        "acc_tau0.95",
        "params",
        "rank_exact",
        "seed",
        "dtype",
        "device",
        "git_commit",
        "versions",
        "db_spec",
        "train_config",
        "unit",
    ):
        assert column in frame, column
    assert (out / "width.png").stat().st_size > 0
    stamp = {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()}
    assert main(["facts", "sweep", "width", "--quick", "--out", str(out), "--no-plot"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()} == stamp  # nothing reran
    assert pd.read_csv(out / "results.csv").equals(frame)


def test_every_experiment_has_valid_quick_units():
    for name in ("width", "budget", "tau", "bound", "measure", "scale"):
        for unit_name, configs in sweep_units(name, quick=True).items():
            check_configs(configs)
            assert callable(unit_function(unit_name))
            json.dumps(configs)  # JSON-serialisable, as run_sweep requires


def test_bound_unit_rows_check_the_bound(tmp_path):
    configs = sweep_units("bound", quick=True)["bound"]
    frame = run_sweep(unit_function("bound"), configs, tmp_path, progress=False)
    assert set(frame["state"]) == {"random", "trained"}
    assert frame["bound_holds"].all()
    assert (frame["construction_residual"] < 1e-8).all()  # the explicit decomposition reproduces L
    assert (frame["flattening_lower"] <= frame["bound"]).all() and (frame["cp_rank"] <= frame["bound"]).all()
    assert (frame["bound"] <= frame["architecture_bound"]).all()


def test_scale_quick_records_timings(tmp_path):
    units = sweep_units("scale", quick=True)
    rank = run_sweep(unit_function("scale-rank"), units["scale-rank"], tmp_path / "rank", progress=False)
    assert rank.loc[0, "bounds_exact"] == 100 and rank.loc[0, "cp_rank"] == 100
    assert rank.loc[0, "cp_reached_by"] == "fit"  # the ALS reached the certified rank on the full tensor
    assert rank.loc[0, "cp_seconds"] > 0 and rank.loc[0, "bounds_seconds"] > 0


def test_unknown_experiment_is_a_usage_error(capsys):
    assert main(["facts", "sweep", "widht"]) == 2
    assert "widht" in capsys.readouterr().err
