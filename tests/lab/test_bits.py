"""Bits per parameter: each room's formula on real result tables, and the ``bits`` command end to end."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import tiny_memorize

from auditor.cli import main
from auditor.core.errors import AuditError
from auditor.lab.bits import COLUMNS, bits_command, bits_table
from auditor.lab.common.mha.model import MHAConfig
from auditor.lab.experiment import run_experiment
from auditor.lab.information import argmax_stored_bits
from auditor.lab.memorize.bits import memorize_bits
from auditor.lab.room import get

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def memorize_run(tmp_path_factory):
    """A real (seconds-long) memorize sweep: its results.csv is what the reader turns into bits."""
    out = tmp_path_factory.mktemp("mem")
    config = tiny_memorize(context=(3,), N=(12,), d=4, classes=3, steps=100, lr=3e-2, eval_every=20, rounds=2)
    run_experiment(get("memorize"), config, out, plots=False, progress=False)
    return out


def test_memorize_bits_follow_the_stated_formula(memorize_run):
    frame = pd.read_csv(memorize_run / "results.csv")
    table = bits_table([memorize_run])
    assert list(table.columns) == list(COLUMNS) and len(table) == len(frame)
    entropy = frame["N"] * math.log2(3)
    errors = frame["N"] - frame["memorized"]
    residual = [math.log2(n + 1) + math.log2(math.comb(n, e)) + e * math.log2(3)
                for n, e in zip(frame["N"], errors)]
    expected = (entropy - residual).clip(lower=0)
    assert table["stored_bits"].to_numpy() == pytest.approx(expected.to_numpy())
    assert table["entropy_bits"].to_numpy() == pytest.approx(entropy.to_numpy())
    assert table["parameters"].tolist() == frame["parameters"].tolist()
    assert table["parameters"].iloc[0] == MHAConfig(heads=1, d=4, d_h=4, d_v=4, outputs=3).num_parameters
    assert table["bits_per_parameter"].to_numpy() == pytest.approx(
        (expected / frame["parameters"]).to_numpy()
    )
    assert (table["converged"] == frame["converged"]).all() and (
        table["formula"].str.startswith("N log2(classes) - [log2(N+1) + log2 C(N, E) + E log2 M]")
    ).all()
    # paper A's bound H(n-1)+1 and Dana et al.'s H d_h + d, in bits of these labels
    assert table["bound_bits_paper_a"].tolist() == pytest.approx([(H * 2 + 1) * math.log2(3) for H in (1, 2)])
    assert table["bound_bits_dana"].tolist() == pytest.approx([(H * 4 + 4) * math.log2(3) for H in (1, 2)])


def test_regression_counts_bins_of_the_error_tolerance():
    frame = pd.DataFrame({"heads": [2], "context": [3], "d_h": [4], "d": [4], "N": [10], "seed": [0],
                          "task": ["regression"], "classes": [100], "outputs": [2], "error_tolerance": [0.05],
                          "memorized": [7], "parameters": [100], "steps_trained": [300], "steps": [300]})
    row = memorize_bits(frame).iloc[0]
    # +-0.05 in [0, 1): 10 bins per output, a label of 2 outputs is one of 100; 3 of 10 labels wrong
    assert row["entropy_bits"] == pytest.approx(10 * 2 * math.log2(10))
    assert row["stored_bits"] == pytest.approx(
        max(0.0, 10 * 2 * math.log2(10) - math.log2(11) - math.log2(120) - 3 * math.log2(100)))
    assert not row["converged"]  # ran its whole budget without memorizing everything


def test_other_rooms_and_the_command(tmp_path):
    facts = tmp_path / "facts" / "width"
    facts.mkdir(parents=True)
    pd.DataFrame(
        {
            "db": ["a"],
            "d_model": [4],
            "heads": [1],
            "d_qk": [2],
            "d_vo": [2],
            "seed": [0],
            "values": [8],
            "triples": [24],
            "parameters": [30],
            "facts_stored": [20],
            "early_stopped": [True],
        }
    ).to_csv(facts / "results.csv", index=False)
    recall = tmp_path / "assoc"
    recall.mkdir()
    pd.DataFrame(
        {
            "d": [8],
            "heads": [2],
            "seed": [0],
            "facts": [16],
            "bits": [48.0],
            "answers_per_relation": [8],
            "parameters": [64],
        }
    ).to_csv(recall / "facts.csv", index=False)
    pd.DataFrame(
        {
            "weights": ["random"],
            "heads": [2],
            "context": [3],
            "d_h": [4],
            "d": [4],
            "N": [8],
            "seed": [0],
            "classes": [3],
            "rank": [5],
            "guaranteed": [5],
        }
    ).to_csv(tmp_path / "certify.csv", index=False)
    table = bits_table([tmp_path]).set_index("experiment")
    # a table read from a file (no generator on record): its 24 facts counted as uniform over the 8 values
    facts_width = float(argmax_stored_bits(24 * 3.0, 24, 20, 8)[0])
    assert table.loc["facts width", "stored_bits"] == pytest.approx(facts_width)
    assert table.loc["facts width", "bits_per_parameter"] == pytest.approx(facts_width / 30)
    assert "generator unknown" in table.loc["facts width", "formula"]
    # no threshold on record: all 16 facts recalled, only the "no error" header is paid
    assert table.loc["recall scaling", "stored_bits"] == pytest.approx(48.0 - math.log2(17))
    assert table.loc["certify", "stored_bits"] == pytest.approx(5 * math.log2(3))  # interpolable labels
    assert table.loc["certify", "entropy_bits"] == pytest.approx(8 * math.log2(3))
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


REPORTS = Path(__file__).resolve().parents[2] / "reports"


def test_every_committed_report_is_read_with_its_own_convergence():
    """Regression: ``audit bits`` on the committed reports raised KeyError 'max_steps' on the trade-off CSV
    written in the current names (steps = budget, steps_trained, converged, answers_per_relation)."""
    table = bits_table([REPORTS / "memorize", REPORTS / "facts", REPORTS / "assoc"], root=REPORTS.parent)
    assert table["bits_per_parameter"].notna().all() and (table["parameters"] > 0).all()
    new = pd.read_csv(REPORTS / "assoc" / "tradeoff-13x13" / "tradeoff.csv")
    rows = table[table["source"] == "reports/assoc/tradeoff-13x13/tradeoff.csv"]
    assert len(rows) == len(new) and (rows["experiment"] == "recall tradeoff").all()
    assert rows["converged"].tolist() == new["converged"].tolist()  # the run's own flag (plateaus included)
    recalled = (new["fact_recall"] * new["facts"]).round()
    expected, _ = argmax_stored_bits(new["facts"] * np.log2(new["answers_per_relation"]), new["facts"],
                                     recalled, new["answers_per_relation"])
    assert rows["stored_bits"].to_numpy() == pytest.approx(expected)
    below_chance = recalled < new["facts"] / new["answers_per_relation"]
    assert below_chance.any() and (rows["stored_bits"].to_numpy()[below_chance.to_numpy()] == 0).all()
    ref = pd.read_csv(REPORTS / "assoc" / "tradeoff.csv")  # the 5 x 5 reference map, current names too
    rows = table[table["source"] == "reports/assoc/tradeoff.csv"]
    assert len(rows) == len(ref) and rows["converged"].tolist() == ref["converged"].tolist()
    scaling = pd.read_csv(REPORTS / "assoc" / "budget-d8" / "facts.csv")  # current names: read, not skipped
    rows = table[table["source"] == "reports/assoc/budget-d8/facts.csv"]
    assert len(rows) == len(scaling) and (rows["stored_bits"] <= scaling["bits"].to_numpy()).all()
    assert rows["converged"].tolist() == scaling["converged"].tolist()


def test_assoc_rows_carry_their_recorded_convergence_and_width():
    """The associative-memory capacity CSV (width, converged columns) is read with its flags."""
    assoc = pd.read_csv(REPORTS / "assoc" / "capacity.csv")
    rows = bits_table([REPORTS / "assoc" / "capacity.csv"])
    assert len(rows) == len(assoc)
    assert rows["converged"].tolist() == assoc["converged"].tolist()
    assert rows["config"].str.contains("width=").all()


def test_a_csv_without_the_step_budget_is_flagged_unknown_not_invented(tmp_path):
    reference = REPORTS / "assoc" / "tradeoff.csv"
    old = pd.read_csv(reference)
    folder = tmp_path / "assoc"
    folder.mkdir()
    old.drop(columns=["converged", "steps"]).to_csv(folder / "tradeoff.csv", index=False)
    table = bits_table([folder])
    assert table["converged"].isna().all()  # steps trained without the budget says nothing about convergence
    full = bits_table([reference])
    assert table["stored_bits"].tolist() == pytest.approx(full["stored_bits"].tolist())
    result = CliRunner().invoke(bits_command, [str(folder), "--out", str(tmp_path / "bits"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "convergence unknown" in result.output and f"({len(old)} rows)" in result.output
    written = pd.read_csv(tmp_path / "bits" / "bits.csv")
    assert written["converged"].isna().all()


def test_an_unreadable_or_incomplete_report_is_a_one_line_error_naming_the_file(tmp_path, capsys):
    folder = tmp_path / "assoc"
    folder.mkdir()
    bad = folder / "facts.csv"
    pd.DataFrame({"d": [8], "heads": [2], "seed": [0], "facts": [16], "bits": [48.0],
                  "parameters": [64]}).to_csv(bad, index=False)  # no D: bits per fact unknown
    with pytest.raises(AuditError, match=r"facts\.csv: a recall result CSV without the column D"):
        bits_table([folder])
    bad.write_text("")
    with pytest.raises(AuditError, match=r"facts\.csv: not a readable result CSV"):
        bits_table([folder])
    assert main(["bits", str(folder), "--out", str(tmp_path / "bits")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and str(bad) in err


def _three_states(tmp_path):
    """A recall scaling CSV with two converged rows, one step-limited row and one without a recorded flag."""
    folder = tmp_path / "assoc"
    folder.mkdir()
    pd.DataFrame(
        {
            "d": [8] * 4,
            "heads": [2] * 4,
            "seed": [0, 1, 2, 3],
            "facts": [16, 32, 80, 72],
            "bits": [48.0, 96.0, 240.0, 216.0],
            "answers_per_relation": [8] * 4,
            "parameters": [64, 65, 66, 67],
            "converged": [True, True, False, None],
        }
    ).to_csv(folder / "facts.csv", index=False)
    return folder


def test_the_plot_and_summary_tell_converged_step_limited_and_unrecorded_rows_apart(tmp_path, monkeypatch):
    """Regression: bits.png drew rows whose convergence is not recorded exactly like converged rows, and the
    printed median and max counted step-limited and unrecorded rows as if they were headline numbers."""
    import auditor.lab.figures as figures
    from auditor.lab import bits

    folder = _three_states(tmp_path)
    table = bits_table([folder])
    assert [table["converged"].iloc[i] for i in range(3)] == [True, True, False] and pd.isna(
        table["converged"].iloc[3]
    )
    drawn = []

    def keep(fig, path, *, title=None, ax=None):  # save() without writing: keep the figure to inspect
        if ax is not None:
            ax.legend()
        drawn.append(fig)
        return Path(path)

    monkeypatch.setattr(figures, "save", keep)
    bits.plot_bits(table, tmp_path / "bits.png")
    ax = drawn[0].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(label.startswith("convergence not recorded") for label in labels), labels
    assert any("step-limited" in label and "excluded" in label for label in labels), labels

    def holding(row):  # the data collection that draws this row's point (bounds excluded)
        point = (table["parameters"].iloc[row], table["bits_per_parameter"].iloc[row])
        found = [c for c in ax.collections if c.get_gid() != "bound" and len(c.get_offsets())
                 and np.isclose(np.asarray(c.get_offsets(), float), point).all(axis=1).any()]
        assert len(found) == 1, found
        return found[0]

    def filled(collection):
        face = collection.get_facecolor()
        return len(face) > 0 and (face[:, 3] > 0).all()

    converged, step_limited, unknown = holding(0), holding(2), holding(3)
    assert holding(1) is converged and filled(converged)
    assert unknown is not converged and not filled(unknown)
    assert step_limited is not converged and not filled(step_limited)
    shape = [c.get_paths()[0].vertices.round(6).tolist() for c in (converged, step_limited, unknown)]
    assert shape[0] != shape[2] and shape[1] != shape[2]  # the unrecorded rows' marker is its own

    summary = bits.bits_summary(table).iloc[0]
    bpp = table["bits_per_parameter"]
    assert (summary["rows"], summary["converged"], summary["step-limited"], summary["not recorded"]) == (
        4,
        2,
        1,
        1,
    )
    assert summary["median (converged)"] == pytest.approx(bpp.iloc[:2].median())
    assert summary["max (converged)"] == pytest.approx(bpp.iloc[:2].max())
    assert summary["max (all rows)"] == pytest.approx(bpp.max())
    result = CliRunner().invoke(bits_command, [str(folder), "--out", str(tmp_path / "bits"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "median (converged)" in result.output and "over the converged rows only" in result.output


LAYER = {"heads": [1, 2], "context": [3, 3], "d_h": [4, 4], "d": [4, 4], "N": [8, 8], "seed": [0, 0]}


@pytest.mark.parametrize("rows, fragment", [
    ({**LAYER, "memorized": [5, -3], "classes": [4, 4], "parameters": [100, 100]},
     "cannot count the bits of this memorize result CSV (the correct count must be finite and >= 0; got -3)"),
    ({**LAYER, "memorized": [5, 5], "classes": [4, 0], "parameters": [100, 100]},
     "cannot count the bits of this memorize result CSV (the label alphabet must be finite and >= 1; got 0)"),
    ({**LAYER, "memorized": [5, 5], "classes": [4, 4], "parameters": [100, 0]},
     "line 3 cannot be counted (memorize room): its parameters 0 are not positive"),
    ({"capacity": [8, 8], "kind": ["linear", "mlp"], "d": [4, 4], "width": [2, 2], "seed": [0, 0],
      "parameters": [-16, 16]}, "line 2 cannot be counted (assoc room): its parameters -16 are not positive"),
])
def test_rows_that_cannot_be_counted_are_refused_naming_file_and_line(tmp_path, capsys, rows, fragment):
    """A foreign CSV whose columns look like a room's used to give negative or infinite bits per parameter."""
    folder = tmp_path / "foreign"
    folder.mkdir()
    pd.DataFrame(rows).to_csv(folder / "results.csv", index=False)
    with pytest.raises(AuditError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        bits_table([folder])
    assert main(["bits", str(folder), "--out", str(tmp_path / "bits")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(folder / "results.csv") in err
    assert not (tmp_path / "bits").exists()  # refused before anything is written
