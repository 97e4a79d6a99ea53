"""The README's table of the reference audits says what the committed reports say: in each cell, the
statements named (refuted / proven / not decided) are exactly those of that test's rows in the report."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from auditor.audit.report.schema import read_rows

ROOT = Path(__file__).resolve().parent.parent
REPORTS = {  # the README row's model -> its report folder
    "ViT-base": "vit-base-imagenet1000",
    "DINOv2-base": "dinov2-base-imagenet500",
    "MiniLM-L6": "minilm-wikitext2",
    "BERT-base": "bert-base-wikitext2",
    "GPT-2": "gpt2-wikitext2",
    "Llama-3.2-1B shape": "llama-3.2-1b-wikitext2",
}
TESTS = ("assumption2", "assumption1", "assumption3", "general_position")  # the table's column order
WORDS = ("refuted", "proven", "not decided")


def readme_cells() -> dict[str, list[str]]:
    """{model: its four cells} from the README's table of the reference audits."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## What the reference audits find"):text.index("## What it tests")]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = next((m for m in REPORTS if cells[0].startswith(m + " (")), None)
        if name and len(cells) == 5:
            out[name] = cells[1:]
    return out


def named(cell: str) -> set[str]:
    return {w for w in WORDS if re.search(rf"\b{w}\b", cell)}


@pytest.mark.parametrize("model", list(REPORTS))
def test_the_readme_names_the_reports_statements(model):
    cells = readme_cells()[model]
    rows = read_rows(ROOT / "reports" / REPORTS[model] / "results.csv")
    rows = rows[rows["status"] == "ok"]
    if model == "MiniLM-L6":  # (the row of its pretrained weights)
        rows = rows[rows["weights"] == "pretrained"]
    for test, cell in zip(TESTS, cells, strict=True):
        if cell.startswith("the same as Assumption 1"):
            cell = cells[TESTS.index("assumption1")]
        assert named(cell) == set(rows.loc[rows["test"] == test, "statement"]), (model, test, cell)
