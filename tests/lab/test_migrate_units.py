"""scripts/migrate_units.py: a folder written with the keys and names of 0.1 resumes after one migration,
computing nothing and giving the same results.csv."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import auditor.lab.sweep as sweep
from auditor.lab.experiment import run_experiment
from auditor.lab.room import get

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("migrate_units", ROOT / "scripts" / "migrate_units.py")
migrate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(migrate)


def _key_of_0_1(config: dict) -> str:
    """The key 0.1 gave a unit: every entry but ``workdir``, defaults included."""
    kept = {k: v for k, v in config.items() if k != "workdir"}
    return hashlib.sha256(sweep._dumps(kept).encode()).hexdigest()[:16]


def write_as_0_1(folder: Path, name: str) -> dict[str, str]:
    """Turn a folder this release wrote into what 0.1 wrote (unit format /1: old entry and column names,
    old keys; the report's gathered tables left out); returns new key -> old key."""
    configs = {
        new: old for entry in migrate.CONFIG_RENAMES.get(name, {}).values() for old, new in entry.items()
    }
    columns = {new: old for old, new in migrate.column_renames(name).items()}
    keys = {}
    for path in sorted((folder / "units").glob("*.json")):
        payload = json.loads(path.read_text())
        config = {
            k: (
                {configs.get(f, f): x for f, x in v.items()}
                if k in migrate.CONFIG_RENAMES.get(name, {})
                else v
            )
            for k, v in payload["config"].items()
        }
        old = keys[path.stem] = _key_of_0_1(config)
        rows = [
            {
                columns.get(c, c): (old if c == "unit" else sweep._dumps(config) if c == "unit_config" else v)
                for c, v in row.items()
            }
            for row in payload["rows"]
        ]
        path.unlink()
        (folder / "units" / f"{old}.json").write_text(
            sweep._dumps(
                {"format": "attention-auditor-unit/1", "key": old, "config": config, "rows": rows},
                sort_keys=False,
            )
        )
    for path in [p for p in folder.rglob("*") if p.is_file() and p.parent.name != "units"]:
        if path.parent == folder:  # results.csv and the report's tables: rebuilt by the run that resumes
            path.unlink()
        elif path.stem in keys and path.suffix == ".pt":  # a checkpoint: only its name holds the key
            path.rename(path.with_name(keys[path.stem] + path.suffix))
        elif path.stem in keys:
            text = path.read_text()
            for new, old in keys.items():
                text = text.replace(new, old)
            path.with_name(keys[path.stem] + path.suffix).write_text(text)
            path.unlink()
    return keys


def refuse(fn, config, root=None):
    raise AssertionError(f"a finished unit ran again: {sweep._dumps(config)[:200]}")


def test_a_folder_of_0_1_resumes_after_the_migration_without_computing(tmp_path, monkeypatch):
    experiment = get("certify")  # its unit had an entry renamed (train_steps) and so had its columns
    config = experiment.make("quick")
    reference = tmp_path / "reference"
    run_experiment(experiment, config, reference, plots=False, progress=False)
    old = tmp_path / "old"
    shutil.copytree(reference, old)
    keys = write_as_0_1(old, "certify")
    assert keys and all(new != old_key for new, old_key in keys.items())
    row = json.loads(next((old / "units").glob("*.json")).read_text())["rows"][0]
    assert "train_steps" in json.loads(row["unit_config"])["request"] and "lower_bound" not in row
    with monkeypatch.context() as patch:  # unmigrated, the old keys find nothing: every unit would run
        patch.setattr(sweep, "run_unit", refuse)
        with pytest.raises(AssertionError, match="ran again"):
            run_experiment(experiment, config, tmp_path / "copy-unmigrated", plots=False, progress=False)
        shutil.rmtree(tmp_path / "copy-unmigrated", ignore_errors=True)

        assert migrate.main([str(old)]) == 0
        assert sorted(p.stem for p in (old / "units").glob("*.json")) == sorted(keys)
        run_experiment(experiment, config, old, plots=False, progress=False)  # refuse: nothing may run
    assert (old / "results.csv").read_text() == (reference / "results.csv").read_text()
    assert (old / "tolerance.csv").read_text() == (reference / "tolerance.csv").read_text()
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    assert migrate.main([str(old)]) == 0  # a second migration changes nothing
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before


def test_a_report_that_kept_only_its_csvs_resumes_once_its_units_are_rebuilt(tmp_path, monkeypatch):
    """The committed reports keep results.csv and the gathered side tables, not units/: --rebuild-units
    gives the units back, and the rerun computes nothing and gives the same rows."""
    experiment = get("certify")
    config = experiment.make("quick")
    first, _ = run_experiment(experiment, config, tmp_path / "run", plots=False, progress=False)
    kept = tmp_path / "kept"
    kept.mkdir()
    for name in ("results.csv", "tolerance.csv"):
        shutil.copy(tmp_path / "run" / name, kept / name)
    assert migrate.main(["--rebuild-units", str(kept)]) == 0
    monkeypatch.setattr(sweep, "run_unit", refuse)
    again, _ = run_experiment(experiment, config, kept, plots=False, progress=False)
    assert again["unit"].tolist() == first["unit"].tolist()
    pd.testing.assert_frame_equal(
        pd.read_csv(kept / "results.csv"), pd.read_csv(tmp_path / "run" / "results.csv")
    )


def test_units_of_memorize_shared_queries_under_their_first_keys_resume_after_the_migration(
    tmp_path, monkeypatch
):
    """The experiment's first units were keyed with every field and memorize's old names (tolerance,
    rank_rtol): the migration finds its kind and re-keys them."""
    experiment = get("memorize shared-queries")
    config = experiment.make("quick", heads=(1,), queries=(1,), N=(16,), steps=20, rounds=1, certify=False)
    reference = tmp_path / "reference"
    run_experiment(experiment, config, reference, plots=False, progress=False)
    old = tmp_path / "old"
    shutil.copytree(reference, old)
    keys = write_as_0_1(old, "memorize shared-queries")
    assert keys and all(new != old_key for new, old_key in keys.items())
    assert migrate.main([str(old)]) == 0
    assert sorted(p.stem for p in (old / "units").glob("*.json")) == sorted(keys)
    monkeypatch.setattr(sweep, "run_unit", refuse)
    run_experiment(experiment, config, old, plots=False, progress=False)
    assert (old / "results.csv").read_text() == (reference / "results.csv").read_text()
