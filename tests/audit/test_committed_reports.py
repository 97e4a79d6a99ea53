"""The committed reference reports say how they were made without leaking the machine that made them:
no absolute paths of a home, work or temporary folder (data paths are recorded as the user gave them,
relative to the repository root); and the lab's sweep folders resume under the commands that made them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPORTS = Path(__file__).resolve().parents[2] / "reports"
ABSOLUTE = re.compile(r"(?:^|[\s,\"'(`=])/(?:work|home|root|tmp|Users|mnt|scratch)/")


def test_committed_reports_hold_no_absolute_machine_paths():
    offenders = []
    for path in sorted(REPORTS.rglob("*")):
        if path.suffix not in {".csv", ".md", ".json", ".txt"}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if ABSOLUTE.search(line):
                offenders.append(f"{path.relative_to(REPORTS)}:{number}")
    assert not offenders, f"absolute paths in committed reports: {offenders[:10]}"


# The command that made each committed lab sweep folder (from the folder's README);
# --no-plots and --out added.
COMMANDS = {
    "memorize/fig2a": "memorize --figure a --seeds 0,1,2 --threads 1",
    "memorize/fig2a-r8": "memorize --figure a --seeds 0,1,2 --threads 1 --rounds 8",
    "memorize/fig2b": "memorize --figure b --seeds 0,1,2 --threads 1",
    "memorize/fig2b-r8": "memorize --figure b --seeds 0,1,2 --threads 1 --rounds 8",
    "memorize/fig2c": "memorize --figure c --seeds 0,1,2 --threads 1",
    "memorize/fig2c-r8": "memorize --figure c --seeds 0,1,2 --threads 1 --rounds 8",
    "memorize/fig2a-d32": "memorize --heads 1:8 --context 16 --d-h 16 --N 2048 --d 32 "
    "--seeds 0,1,2 --threads 1",
    "memorize/certify": "certify --heads 4 --context 8 --d-h 1,2,4,16 --N 4:64:4,96,128,256 --d 16 "
    "--seeds 0,1 "
    "--steps 500 --threads 1",
    "memorize/certify-nonshared": "certify --heads 4 --context 8 --d-h 1,2,4,16 --N 4:64:4,96,128,256 --d 16 "
    "--seeds 0,1 --steps 500 --threads 1 --non-shared",
    "facts/width": "facts width --threads 1",
    "facts/budget": "facts budget --threads 1",
    "facts/tau": "facts tau --threads 1",
    "facts/bound": "facts bound --threads 1",
    "facts/measure": "facts measure --threads 1",
    "facts/scale": "facts scale --threads 1",
}


QUICK = ("memorize/fig2a", "memorize/certify", "facts/tau")  # one per kind of unit; the others are slow


@pytest.mark.parametrize(
    "folder", [f if f in QUICK else pytest.param(f, marks=pytest.mark.slow) for f in COMMANDS]
)
def test_committed_lab_reports_resume_without_computing(folder, tmp_path, monkeypatch):
    """A copy of each committed sweep folder, its units rebuilt from its CSVs (scripts/migrate_units.py),
    resumes under the command that made it: no unit runs, and the rows are the committed ones."""
    from auditor.cli import main
    from auditor.lab import sweep

    copy = tmp_path / folder.replace("/", "-")
    shutil.copytree(REPORTS / folder, copy)
    script = REPORTS.parent / "scripts" / "migrate_units.py"
    subprocess.run(
        [sys.executable, str(script), "--rebuild-units", str(copy)], check=True, capture_output=True
    )

    def refuse(fn, config, root=None):
        raise AssertionError(f"{folder}: a committed unit would run again: {sweep._dumps(config)[:300]}")

    monkeypatch.setattr(sweep, "run_unit", refuse)
    monkeypatch.chdir(REPORTS.parent)
    assert main([*COMMANDS[folder].split(), "--no-plots", "--out", str(copy)]) == 0
    for results in (REPORTS / folder).rglob("results.csv"):
        committed = pd.read_csv(results)
        again = pd.read_csv(copy / results.relative_to(REPORTS / folder))[committed.columns]
        pd.testing.assert_frame_equal(again, committed)
