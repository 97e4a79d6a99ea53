"""Facts room from the shell and as sweeps: `audit facts ...`, resumable units, provenance, plots."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from auditor.cli import main
from auditor.lab.room import get
from auditor.lab.sweep import run_sweep


def quick_units(name: str, tmp_path) -> list[dict]:
    """The units of ``audit facts NAME --scale quick``."""
    experiment = get(f"facts {name}")
    return experiment.units(experiment.make("quick"), tmp_path)

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
    out = tmp_path / "rank"
    assert main(["facts", "rank", str(db), "--threads", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "exact_rank" in printed and "cp_rank" in printed
    row = pd.read_csv(out / "results.csv").iloc[0]  # --out is a folder, as everywhere
    assert row["exact_rank"] == 6 and row["cp_rank"] == 6 and row["bounds_paper_bound"] == 12
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
    assert (frame["layer_flattening_lower"] <= frame["layer_bound"]).all()
    assert (frame["layer_cp_rank"] <= frame["layer_bound"]).all()
    assert (frame["construction_residual"] < 1e-8).all()
    assert main(["facts", "train", str(db), "--d-model", "4", "--d-vo", "5", "--budget"]) == 2


def test_width_sweep_runs_resumes_and_plots(tmp_path):
    out = tmp_path / "width"
    assert main(["facts", "width", "--scale", "quick", "--out", str(out)]) == 0
    frame = pd.read_csv(out / "results.csv")
    assert len(frame) == 4  # quick grid: d_model in (2, 4) x d_vo in (1, 2)
    for column in (
        "accuracy",
        "acc_tau0.95",
        "parameters",
        "bounds_exact",
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
    assert main(["facts", "width", "--scale", "quick", "--out", str(out), "--no-plots"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()} == stamp  # nothing reran
    assert pd.read_csv(out / "results.csv").equals(frame)


def test_every_experiment_has_valid_quick_units(tmp_path):
    for name in ("width", "budget", "tau", "bound", "measure", "scale"):
        configs = quick_units(name, tmp_path)
        assert configs and all(unit["experiment"].startswith(name) for unit in configs)
        json.dumps(configs)  # JSON-serialisable, as run_sweep requires


def test_bound_unit_rows_check_the_bound(tmp_path):
    frame = run_sweep(get("facts bound").run_unit, quick_units("bound", tmp_path), tmp_path, progress=False)
    assert set(frame["state"]) == {"random", "trained"}
    assert frame["bound_holds"].all()
    assert (frame["construction_residual"] < 1e-8).all()  # the explicit decomposition reproduces L
    assert (frame["layer_flattening_lower"] <= frame["layer_bound"]).all()
    assert (frame["layer_cp_rank"] <= frame["layer_bound"]).all()
    assert (frame["layer_bound"] <= frame["architecture_bound"]).all()


def test_scale_quick_records_timings(tmp_path):
    units = [u for u in quick_units("scale", tmp_path) if u["experiment"] == "scale-rank"]
    rank = run_sweep(get("facts scale").run_unit, units, tmp_path / "rank", progress=False)
    assert rank.loc[0, "bounds_exact"] == 100 and rank.loc[0, "cp_rank"] == 100
    assert rank.loc[0, "cp_reached_by"] == "fit"  # the ALS reached the certified rank on the full tensor
    assert rank.loc[0, "cp_seconds"] > 0 and rank.loc[0, "bounds_seconds"] > 0


def test_unknown_experiment_is_a_usage_error(capsys):
    assert main(["facts", "widht"]) == 2
    assert "widht" in capsys.readouterr().err


def test_tau_command_takes_its_database_widths_taus_and_steps(tmp_path, capsys):
    db = tmp_path / "db.csv"
    assert (
        main(["facts", "generate", "--keys", "6", "--queries", "3", "--values-per-query", "2", "-o", str(db)])
        == 0
    )
    out = tmp_path / "csv"
    args = [
        "--d-model",
        "2,3",
        "--tau",
        "0.5,0.9",
        "--steps",
        "30",
        "--lr",
        "1e-2",
        "--seeds",
        "0",
        "--no-plots",
    ]
    assert main(["facts", "tau", str(db), *args, "--threads", "1", "--out", str(out)]) == 0
    frame = pd.read_csv(out / "results.csv")
    assert sorted(set(frame["d_model"])) == [2, 3] and (frame["d_vo"] == frame["d_model"]).all()
    assert sorted(set(frame["tau"])) == [0.5, 0.9] and len(frame) == 4
    assert set(frame["triples"]) == {18} and set(frame["db"]) == {"db"}  # the CSV, not the generated default
    assert json.loads(frame["train_config"].iloc[0])["steps"] == 30
    assert json.loads(frame["db_spec"].iloc[0]) == {"csv": str(db.resolve())}

    out = tmp_path / "generated"
    generated = [
        "--kind",
        "random",
        "--keys",
        "5",
        "--queries",
        "3",
        "--values-per-query",
        "2",
        "--no-shared-values",
        "--db-seeds",
        "1",
        "--d-model",
        "2",
        "--d-vo",
        "1,2",
        "--tau",
        "0.9",
        "--steps",
        "20",
        "--seeds",
        "0",
    ]
    assert main(["facts", "tau", *generated, "--no-plots", "--threads", "1", "--out", str(out)]) == 0
    frame = pd.read_csv(out / "results.csv")
    assert list(frame["d_vo"]) == [1, 2] and set(frame["d_qk"]) == {2}
    assert (frame[["keys", "queries", "values", "triples"]].iloc[0] == [5, 3, 6, 15]).all()
    assert set(frame["db"]) == {"random-5x3-v2block-s1"}
    capsys.readouterr()

    for bad, says in [(["--tau", "1.5"], "--tau takes thresholds in (0, 1)"),
                      ([str(db), "--keys", "4"], "replaces the generated database; leave out --keys"),
                      (["--keys", "0"], "keys must be >= 1"),
                      (["--density", "2"], "density must be in (0, 1]")]:
        assert main(["facts", "tau", *bad, "--out", str(tmp_path / "refused")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
        assert not (tmp_path / "refused").exists()
