"""``audit compare``: report folders (written by the real audit, and the committed references) or model
names side by side in one table, with overlay figures; one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import torch
from PIL import Image

import auditor
from auditor.audit.compare import COMPARE_COLUMNS, compare, resolve_report
from auditor.audit.report.schema import read_rows
from auditor.cli import main
from auditor.core.errors import AuditError

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def _report(folder: Path, seed: int) -> pd.DataFrame:
    gen = torch.Generator().manual_seed(seed)
    contexts = torch.randn(16, 3, 6, generator=gen, dtype=torch.float64)  # (N, n, d)
    return auditor.audit_tokens(
        contexts, contexts[:, 0].clone(), subsets=20, seed=seed, out=folder, progress=False
    )


def _expected(rows: pd.DataFrame) -> list[tuple]:
    """The tested rows of a report as compare shows them (skipped rows are folded into the reports table)."""
    return [(r["representation"], r["weights"], r["test"], r["k"], r["statement"],
             bool(r["share_meets_threshold"]), float(r["fraction"]))
            for r in rows.to_dict("records") if r["status"] == "ok"]


def _got(table: pd.DataFrame) -> list[tuple]:
    return [(r["representation"], r["weights"], r["test"], r["k"], r["statement"],
             bool(r["share_meets_threshold"]), r["fraction"]) for r in table.to_dict("records")]


def test_two_audits_compare_row_for_row(tmp_path):
    first = _report(tmp_path / "reports" / "tensors-a", seed=0)
    second = _report(tmp_path / "reports" / "tensors-b", seed=1)
    notes = []
    table = compare(
        [tmp_path / "reports" / "tensors-a", "reports/tensors-b"],
        tmp_path / "cmp",
        root=tmp_path,
        echo=notes.append,
    )
    assert list(table.columns) == list(COMPARE_COLUMNS)
    assert _got(table) == _expected(first) + _expected(second)
    assert set(table["model"]) == {"tensors"}
    written = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(written["statement"]) == list(table["statement"])
    assert list(written["share_meets_threshold"]) == list(table["share_meets_threshold"])
    assert set(written[["N", "n", "d"]].itertuples(index=False, name=None)) == {(16, 3, 6)}
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert (
        "tensors (tensors-a)" in markdown and "tensors (tensors-b)" in markdown
    )  # same model twice: folders
    with Image.open(tmp_path / "cmp" / "compare_kruskal.png") as image:
        assert image.info["dpi"] == pytest.approx((300, 300), abs=0.5)
    assert notes == [f"wrote {tmp_path / 'cmp'}"]


def test_a_model_name_picks_its_newest_report(tmp_path):
    for name, seed in (("tensors-old", 0), ("tensors-new", 1)):
        _report(tmp_path / "reports" / name, seed=seed)
    old, new = (tmp_path / "reports" / n / "results.csv" for n in ("tensors-old", "tensors-new"))
    os.utime(old, (1_000_000, 1_000_000))
    folder, note = resolve_report("tensors", tmp_path)
    assert folder == tmp_path / "reports" / "tensors-new" and "tensors-new" in note
    os.utime(new, (500_000, 500_000))
    assert resolve_report("tensors", tmp_path)[0] == tmp_path / "reports" / "tensors-old"


NEW_COLUMNS = [
    "fraction_low",
    "fraction_high",
    "margin_bound",
    "critical_rtol",
    "critical_rtol_low",
    "critical_rtol_high",
    "verdict_margin",
    "rtol_grid",
    "krank_lower",
    "krank_lower_method",
    "krank_upper",
    "duplicates",
    "near_duplicates",
    "effective_rank",
    "stable_rank",
    "anisotropy",
    "collapse_residual",
]


def test_a_committed_report_compares_with_a_report_written_before_the_new_columns(tmp_path):
    committed = REPO / "reports" / "minilm-wikitext2"
    old = tmp_path / "minilm-old"  # the same rows as a release before robustness and bounds wrote them
    old.mkdir()
    frame = pd.read_csv(committed / "results.csv", dtype=str)
    frame.drop(columns=[c for c in NEW_COLUMNS if c in frame.columns]).to_csv(
        old / "results.csv", index=False
    )
    table = compare([str(committed), str(old)], tmp_path / "cmp", root=REPO, plots=False)
    expected = sum((_expected(read_rows(folder / "results.csv")) for folder in (committed, old)), [])
    assert _got(table) == expected
    minilm = table[table["report"].astype(str).str.endswith("minilm-wikitext2")]
    minilm = minilm.set_index(["representation", "weights", "test"])
    assert minilm.loc[("random-attention", "pretrained", "assumption1"), "share_meets_threshold"]
    assert minilm.loc[("random-attention", "pretrained", "assumption1"), "statement"] == "not decided"
    assert not minilm.loc[("embedding", "pretrained", "assumption1"), "share_meets_threshold"]
    assert minilm.loc[("embedding", "pretrained", "assumption1"), "statement"] == "refuted"
    assert minilm["critical_rtol"].notna().all()
    older = table[table["report"].astype(str).str.endswith("minilm-old")]
    assert older["fraction_low"].isna().all() and older["critical_rtol"].isna().all()  # older files: empty


def test_compare_writes_a_depth_overlay_when_a_report_has_depth_csv(tmp_path):
    folder = tmp_path / "r"
    _report(folder, seed=0)
    pd.DataFrame({"model": "tensors", "weights": ["pretrained"] * 3 + ["random"] * 3,
                  "representation": ["embedding", "block.0", "block.1"] * 2, "depth": [0, 1, 2] * 2,
                  "krank_estimate": [1, 5, 4, 1, 6, 6], "effective_rank": [3.0, 4.0, 5.0, 3.0, 4.5, 5.5]}
                 ).to_csv(folder / "depth.csv", index=False)
    compare([folder], tmp_path / "cmp", root=tmp_path)
    with Image.open(tmp_path / "cmp" / "compare_depth.png") as image:
        assert image.width == 1050


def test_bad_references_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AuditError, match="no results.csv in"):
        resolve_report(tmp_path / "empty", tmp_path)
    with pytest.raises(AuditError, match="no report folder or model 'vit-bse'"):
        resolve_report("vit-bse", tmp_path)
    assert main(["compare", str(tmp_path / "nosuch")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no report folder or model") and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------------
# Every input checked before any work: one line naming the file and what is wrong
# ---------------------------------------------------------------------------------------------------


def _audit_rows(model: str, seed: int) -> pd.DataFrame:
    """A small audit's rows under the model name ``model`` (as `audit MODEL` would write them)."""
    frame = pd.read_csv(REPO / "reports" / "minilm-wikitext2" / "results.csv", dtype=str).head(4 + seed)
    return frame.assign(model=model)


def test_a_model_name_means_that_model_and_no_other_sharing_its_prefix(tmp_path):
    reports = tmp_path / "reports"
    for folder, model in (("gpt2-20260101", "gpt2"), ("gpt2-large-20260301", "gpt2-large")):
        (reports / folder).mkdir(parents=True)
        _audit_rows(model, 0).to_csv(reports / folder / "results.csv", index=False)
    os.utime(reports / "gpt2-large-20260301" / "results.csv", (2_000_000, 2_000_000))  # newer than gpt2's
    os.utime(reports / "gpt2-20260101" / "results.csv", (1_000_000, 1_000_000))
    folder, note = resolve_report("gpt2", tmp_path)
    assert folder == reports / "gpt2-20260101" and "model 'gpt2'" in note
    assert resolve_report("gpt2-large", tmp_path)[0] == reports / "gpt2-large-20260301"
    with pytest.raises(AuditError, match="models with reports there: gpt2, gpt2-large"):
        resolve_report("gpt", tmp_path)


def _one_line_error(capsys, *argv: str) -> str:
    assert main(["compare", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "damage, fragment",
    [
        (lambda text: "", "empty file (0 bytes)"),
        (
            lambda text: text[: text.index("\n", text.index("\n") + 1) + 40],
            "cells where the header has",
        ),  # cut mid-row
        (lambda text: text.rstrip("\n")[:-3], "ends mid-row"),  # the last row cut in its last cell
        (lambda text: text.split("\n")[0] + "\n", "a header without rows"),
        (lambda text: text.replace(",True,", ",maybe,", 1), "'maybe' is not True or False"),
        (lambda text: text.replace(",ok,", ",done,", 1), "'done' is not a status"),
        (lambda text: b"\xff\xfe\x00garbage".decode("latin-1"), "not a text file"),
    ],
)
def test_a_damaged_results_csv_is_refused_naming_the_file(tmp_path, capsys, damage, fragment):
    folder = tmp_path / "damaged"
    folder.mkdir()
    text = (REPO / "reports" / "minilm-wikitext2" / "results.csv").read_text()
    data = damage(text)
    (folder / "results.csv").write_bytes(
        data.encode("latin-1") if fragment == "not a text file" else data.encode()
    )
    err = _one_line_error(capsys, str(folder), "--out", str(tmp_path / "cmp"))
    assert str(folder / "results.csv") in err and fragment in err
    assert not (tmp_path / "cmp").exists()  # refused before any work


def test_a_lab_folder_or_a_foreign_csv_is_not_an_audit_report(tmp_path, capsys):
    lab = tmp_path / "lab"
    assert (
        main(["facts", "width", "--scale", "quick", "--threads", "1", "--no-plots", "--out", str(lab)]) == 0
    )
    capsys.readouterr()
    err = _one_line_error(capsys, str(lab), "--out", str(tmp_path / "cmp"))
    assert str(lab / "results.csv") in err and "results of a lab sweep" in err
    other = tmp_path / "other"
    other.mkdir()
    pd.DataFrame({"name": ["a"], "value": [1]}).to_csv(other / "results.csv", index=False)
    err = _one_line_error(capsys, str(other), "--out", str(tmp_path / "cmp"))
    assert "not an audit's results.csv (no column model, representation, weights, test, status)" in err


def test_an_empty_depth_csv_is_refused_naming_the_file(tmp_path, capsys):
    folder = tmp_path / "r"
    _report(folder, seed=0)
    (folder / "depth.csv").write_text("")
    err = _one_line_error(capsys, str(folder), "--out", str(tmp_path / "cmp"))
    assert str(folder / "depth.csv") in err and "empty file" in err
