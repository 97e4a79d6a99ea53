"""A verdict never contradicts its evidence: every tested row states the strict statement (Kruskal rank >= k,
or every context of rank n) as refuted, proven or not decided, before the sampled share and its threshold;
the word "holds" appears nowhere beside a witness, in the CSV, summary.md, the console table, depth.csv or
``audit compare``. Reports written with the old ``holds`` column are read with today's names."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

import auditor
from auditor.audit.compare import compare
from auditor.audit.report.depth import depth_frame, read_depth
from auditor.audit.report.schema import COLUMNS, NOT_DECIDED, PROVEN, REFUTED, read_rows, statement_of
from auditor.audit.report.tables import cell, summary_table

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def _planted(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """12 contexts (3 x 6) and 12 queries in d = 6 with x5 = x1 + x2: the only dependent 3-subset of the
    queries is {1, 2, 5}, so Kruskal rank 2 < n = 3 while 219 of the 220 3-subsets are full rank."""
    gen = torch.Generator().manual_seed(seed)
    contexts = torch.randn(12, 3, 6, generator=gen, dtype=torch.float64)
    queries = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    queries[5] = queries[1] + queries[2]
    return contexts, queries


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted")
    contexts, queries = _planted()
    rows = auditor.audit_tokens(contexts, queries, subsets=500, out=out, progress=False)
    return rows, out


def test_a_share_above_its_threshold_is_no_proof_when_a_witness_refutes(planted):
    rows, out = planted
    a1 = rows.set_index("test").loc["assumption1"]
    queries = _planted()[1]
    dependent = sum(int(torch.linalg.matrix_rank(queries[list(s)]) < 3)
                    for s in itertools.combinations(range(12), 3))
    assert dependent == 1  # the planted subset and no other
    assert a1["fraction"] == pytest.approx(219 / 220, abs=0.5 / 220)  # every 3-subset enumerated
    assert bool(a1["exhaustive"]) and bool(a1["share_meets_threshold"])  # 0.9955 >= 0.99
    assert sorted(a1["witness"]) == [1, 2, 5]
    assert a1["statement"] == REFUTED
    text = cell(a1)
    assert text.startswith("refuted: Kruskal rank < 3") and "threshold 0.99 met" in text
    assert "99.5" in text and "of all 220 3-subsets full rank" in text


def test_no_holds_anywhere_in_the_files_of_a_refuted_audit(planted):
    rows, out = planted
    written = pd.read_csv(out / "results.csv")
    assert "holds" not in written.columns and {"statement", "share_meets_threshold"} <= set(written.columns)
    assert list(written.columns[: len(COLUMNS)]) == COLUMNS
    assert set(written["statement"].dropna()) <= {REFUTED, PROVEN, NOT_DECIDED}
    summary = (out / "summary.md").read_text()
    assert "holds" not in summary
    table = summary_table(rows)
    assert "holds" not in table.to_string()
    # the statement of every cell comes first, the share second
    for value in table.to_numpy().ravel():
        assert value.split(":")[0] in (REFUTED, PROVEN, NOT_DECIDED), value


def test_a_certified_bound_proves_the_statement_and_nothing_is_left_undecided_by_mistake():
    gen = torch.Generator().manual_seed(1)
    contexts = torch.randn(12, 3, 6, generator=gen, dtype=torch.float64)
    rows = auditor.audit_tokens(contexts, contexts[:, 0].clone(), subsets=500, progress=False)
    for row in rows.to_dict("records"):
        assert row["statement"] == PROVEN, (row["test"], row["krank_lower"], row["k"])
        assert "proven" in cell(pd.Series(row))


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"test": "assumption1", "fraction": 1.0, "k": 5, "witness": None}, NOT_DECIDED),
        ({"test": "assumption1", "fraction": 1.0, "k": 5, "krank_lower": 5}, PROVEN),
        ({"test": "assumption1", "fraction": 1.0, "k": 5, "krank_lower": 4}, NOT_DECIDED),
        ({"test": "assumption1", "fraction": 1.0, "k": 5, "exhaustive": True}, PROVEN),
        ({"test": "assumption1", "fraction": 0.999, "k": 5, "witness": [1, 2, 3, 4, 5]}, REFUTED),
        ({"test": "assumption1", "fraction": 1.0, "k": 5, "krank_upper": 3}, REFUTED),  # a smaller subset
        ({"test": "assumption1", "fraction": 1.0, "k": 5, "krank_upper": 5, "krank_lower": 5}, PROVEN),
        ({"test": "general_position", "fraction": 0.0, "k": 5, "spectrum_proof": True}, REFUTED),
        ({"test": "assumption1", "fraction": 0.5, "k": 5, "krank_lower": 9, "witness": [0, 1]}, REFUTED),
        ({"test": "assumption2", "fraction": 1.0, "k": 5}, PROVEN),
        ({"test": "assumption2", "fraction": 0.99, "k": 5, "share_meets_threshold": True}, REFUTED),
        ({"test": "assumption1", "status": "skipped", "fraction": None, "k": 5}, None),
    ],
)
def test_the_statement_of_a_row(row, expected):
    assert statement_of(row) == expected


def test_a_report_written_with_holds_reads_with_todays_names(planted, tmp_path):
    _, out = planted
    old = pd.read_csv(out / "results.csv").drop(columns=["statement"])
    old = old.rename(columns={"share_meets_threshold": "holds"})
    (tmp_path / "old").mkdir()
    old.to_csv(tmp_path / "old" / "results.csv", index=False)
    now, before = read_rows(out / "results.csv"), read_rows(tmp_path / "old" / "results.csv")
    assert "holds" not in before.columns
    pd.testing.assert_series_equal(before["statement"], now["statement"])
    pd.testing.assert_series_equal(before["share_meets_threshold"], now["share_meets_threshold"])


def test_a_depth_csv_written_with_holds_reads_with_todays_names():
    committed = REPO / "reports" / "minilm-wikitext2"
    assert "assumption1_holds" in pd.read_csv(committed / "depth.csv", nrows=1).columns  # written before
    old, now = read_depth(committed / "depth.csv"), depth_frame(read_rows(committed / "results.csv"))
    assert not any(c.endswith("_holds") for c in old.columns)
    for test in ("assumption2", "assumption1", "general_position"):  # whose bounds depth.csv carries
        assert old[f"{test}_statement"].tolist() == now[f"{test}_statement"].tolist()
        assert old[f"{test}_share_meets_threshold"].tolist() == now[f"{test}_share_meets_threshold"].tolist()


def test_compare_states_the_statement_and_what_each_report_measured(planted, tmp_path):
    _, out = planted
    table = compare([out], tmp_path / "cmp", root=tmp_path, plots=False)
    a1 = table.set_index("test").loc["assumption1"]
    assert a1["statement"] == REFUTED and bool(a1["share_meets_threshold"])
    assert (a1["N"], a1["n"], a1["d"], a1["k"]) == (12, 3, 6, 3)
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert "holds" not in markdown
    described = r"\| tensors +\| tensors +\| tensors given to audit_tokens +\| 12 +\| 3 +\| 6 +\| given "
    assert re.search(described, markdown)


def test_the_summarys_test_seconds_are_its_stage_tables(planted):
    """"rank tests took X s of the run's W s" is read off the time-per-stage table of the same page."""
    _, out = planted
    summary = (out / "summary.md").read_text()
    found = re.search(r"rank tests took ([\d.]+) s of the run's ([\d.]+) s", summary)
    took, wall = map(float, found.groups())
    table = summary[summary.index("## Time per stage"):]
    stages = dict(re.findall(r"^\| ([^|]+?) +\| ([\d.]+) +\|", table, flags=re.MULTILINE))
    tests = sum(float(s) for name, s in stages.items() if name.split(" ")[0] in
                ("assumption1", "assumption2", "assumption3", "general_position"))
    slack = 0.005 * len(stages) + 0.05  # each stage printed to 0.01 s, each total to 0.1 s
    assert tests == pytest.approx(took, abs=slack) and sum(map(float, stages.values())) == pytest.approx(
        wall, abs=slack)


def test_compare_folds_skipped_rows_into_one_cell_per_report(planted, tmp_path):
    _, out = planted
    rows = pd.read_csv(out / "results.csv")
    skipped = rows.assign(weights="pretrained", status="skipped", note="weights unavailable: offline")
    measured = [c for c in rows.columns if c not in ("model", "representation", "layer", "weights", "test",
                                                      "status", "note", "seed")]
    skipped[measured] = None
    folder = tmp_path / "with-skipped"
    folder.mkdir()
    pd.concat([rows, skipped]).to_csv(folder / "results.csv", index=False)
    table = compare([folder], tmp_path / "cmp", root=tmp_path, plots=False)
    assert set(table["weights"]) == {"given"} and len(table) == len(rows)  # tested rows only
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert "4 rows of pretrained: weights unavailable" in markdown
    assert markdown.count("pretrained") == 1  # folded: one cell, no row per skipped test
