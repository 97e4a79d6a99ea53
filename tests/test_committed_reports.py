"""The committed reference reports say how they were made without leaking the machine that made them:
no absolute paths of a home, work or temporary folder (data paths are recorded as the user gave them,
relative to the repository root)."""

from __future__ import annotations

import re
from pathlib import Path

REPORTS = Path(__file__).resolve().parent.parent / "reports"
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
