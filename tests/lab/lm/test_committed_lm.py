"""The committed reference of ``audit lm`` (reports/lm/reference) agrees with itself and with docs/lab.md:
its summary is what the report code computes from its rows, and every plateau the docs quote is the
summary's."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from auditor.lab.lm.experiment import REFERENCE_LR, REFERENCE_MODELS, REFERENCE_STEPS, plateau_table

ROOT = Path(__file__).resolve().parents[3]
REFERENCE = ROOT / "reports" / "lm" / "reference"
EPS = float(np.finfo(np.float64).eps)


@pytest.fixture(scope="module")
def committed() -> tuple[pd.DataFrame, pd.DataFrame]:
    rows = pd.read_csv(REFERENCE / "results.csv", comment="#")
    summary = pd.read_csv(REFERENCE / "summary.csv", comment="#")
    return rows, summary


def test_the_reference_ran_every_unit_of_its_preset(committed):
    rows, _ = committed
    assert len(rows) == len(REFERENCE_MODELS) * 3 * 3 * 2  # models x dataset sizes x seeds x precisions
    budget = rows.drop_duplicates("model").set_index("model")
    for model, steps, lr in zip(REFERENCE_MODELS, REFERENCE_STEPS, REFERENCE_LR):
        assert (budget.loc[model, "steps"], budget.loc[model, "lr"]) == (steps, lr)


def test_the_summary_is_what_the_report_computes_from_the_rows(committed):
    rows, summary = committed
    again = plateau_table(rows).set_index(["model", "dtype"])
    summary = summary.set_index(["model", "dtype"])
    assert sorted(again.index) == sorted(summary.index)
    for key in summary.index:
        for column in ("parameters", "sequences", "seeds", "converged", "capacity_limited"):
            assert again.loc[key, column] == summary.loc[key, column], (key, column)
        # a mean of three values read back from their shortest round-trip text: a sum of 3 and a division,
        # each rounding by at most eps relative
        mean = summary.loc[key, "bits_per_parameter"]
        assert again.loc[key, "bits_per_parameter"] == pytest.approx(mean, rel=4 * EPS)
        # an end is mean -/+ t s / sqrt(3): the standard deviation's few roundings (relative eps each, on
        # the seeds' deviations, scale <= the mean) and the t quantile's (scipy documents ~eps relative), so
        # the ends agree within a few eps of (|mean| + the half width); 16 eps leaves room for both
        bound = 16 * EPS * (abs(mean) + abs(summary.loc[key, "ci_high"] - mean))
        for column in ("ci_low", "ci_high"):
            assert again.loc[key, column] == pytest.approx(summary.loc[key, column], abs=bound), (key, column)


def test_the_docs_quote_the_committed_plateaus(committed):
    _, summary = committed
    text = (ROOT / "docs" / "lab.md").read_text()
    section = text[text.index("## Capacity lab IV"):]
    for r in summary.itertuples():
        quoted = f"{r.bits_per_parameter:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]"
        line = next((ln for ln in section.splitlines() if ln.startswith(f"| {r.model} |")), None)
        assert line is not None, r.model
        assert quoted in line, (r.model, r.dtype, quoted, line)
        parameters = f"{r.parameters:,}"
        assert re.search(rf"\| {re.escape(parameters)} \|", line), (r.model, parameters)
