"""Bits per parameter: each room's formula on real result tables, and the ``bits`` command end to end."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from click.testing import CliRunner

from auditor.errors import AuditError
from auditor.lab.bits import COLUMNS, REAL_BITS, bits_command, bits_table, memorize_bits
from auditor.lab.memorize.model import MHAConfig
from auditor.lab.memorize.train import MemorizeSettings, grid, run_memorize

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def memorize_run(tmp_path_factory):
    """A real (seconds-long) memorize sweep: its results.csv is what the reader turns into bits."""
    out = tmp_path_factory.mktemp("mem")
    runs = grid([1, 2], [3], [4], [12], [0], d=4, classes=3)
    run_memorize(runs, MemorizeSettings(steps=100, lr=3e-2, batch_size=16, eval_every=20, rounds=2), out,
                 progress=False)
    return out


def test_memorize_bits_follow_the_stated_formula(memorize_run):
    frame = pd.read_csv(memorize_run / "results.csv")
    table = bits_table([memorize_run])
    assert list(table.columns) == list(COLUMNS) and len(table) == len(frame)
    expected = frame["memorized"] * math.log2(3)
    assert table["stored_bits"].to_numpy() == pytest.approx(expected.to_numpy())
    assert table["parameters"].tolist() == frame["parameters"].tolist()
    assert table["parameters"].iloc[0] == MHAConfig(heads=1, d=4, d_h=4, d_v=4, outputs=3).num_parameters
    assert table["bits_per_parameter"].to_numpy() == pytest.approx((expected / frame["parameters"]).to_numpy())
    assert (table["converged"] == frame["converged"]).all() and (table["formula"] == "memorized x log2(classes)").all()
    # paper A's bound H(n-1)+1 and Dana et al.'s H d_h + d, in bits of these labels
    assert table["bound_bits_paper_a"].tolist() == pytest.approx([(H * 2 + 1) * math.log2(3) for H in (1, 2)])
    assert table["bound_bits_dana"].tolist() == pytest.approx([(H * 4 + 4) * math.log2(3) for H in (1, 2)])


def test_regression_counts_bins_of_the_error_tolerance_and_old_columns_still_read():
    old = pd.DataFrame({"heads": [2], "context": [3], "d_h": [4], "d": [4], "N": [10], "seed": [0], "task": ["regression"],
                        "classes": [100], "outputs": [2], "tolerance": [0.05], "memorized": [7], "parameters": [100],
                        "steps": [300], "max_steps": [300]})  # an earlier release: tolerance, steps = trained
    row = memorize_bits(old).iloc[0]
    assert row["stored_bits"] == pytest.approx(7 * 2 * math.log2(10))  # +-0.05 in [0, 1): 10 bins per output
    assert not row["converged"]  # ran its whole budget without memorizing everything


def test_other_rooms_and_the_command(tmp_path):
    facts = tmp_path / "facts" / "width"
    facts.mkdir(parents=True)
    pd.DataFrame({"db": ["a"], "d_model": [4], "heads": [1], "d_qk": [2], "d_vo": [2], "seed": [0], "values": [8],
                  "params": [30], "facts_stored": [20], "early_stopped": [True]}).to_csv(facts / "results.csv", index=False)
    recall = tmp_path / "assoc"
    recall.mkdir()
    pd.DataFrame({"d": [8], "heads": [2], "seed": [0], "facts": [16], "bits": [48.0], "D": [8],
                  "params": [64]}).to_csv(recall / "facts.csv", index=False)
    pd.DataFrame({"weights": ["random"], "heads": [2], "context": [3], "d_h": [4], "d": [4], "N": [8], "seed": [0],
                  "classes": [3], "rank": [5], "guaranteed": [5]}).to_csv(tmp_path / "certify.csv", index=False)
    table = bits_table([tmp_path]).set_index("experiment")
    assert table.loc["facts width", "stored_bits"] == pytest.approx(20 * 3.0)
    assert table.loc["facts width", "bits_per_parameter"] == pytest.approx(2.0)
    assert table.loc["recall scaling", "stored_bits"] == pytest.approx(48.0)  # the room's own bits column agrees
    assert table.loc["certify", "stored_bits"] == 5 * REAL_BITS
    out = tmp_path / "bits"
    result = CliRunner().invoke(bits_command, [str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    written = pd.read_csv(out / "bits.csv")
    assert {"git_commit", "versions"} <= set(written) and len(written) == 3
    assert (out / "bits.png").stat().st_size > 0


def test_missing_or_empty_report_folders_are_one_line_errors(tmp_path):
    with pytest.raises(AuditError, match="does not exist"):
        bits_table([tmp_path / "nope"])
    with pytest.raises(AuditError, match="no result CSV"):
        bits_table([tmp_path])
