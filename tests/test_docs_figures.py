"""The documents quote one source for each figure and name: the memory figures of README and
docs/auditor.md are those of the benchmark report, the family lists are the registry's, the words a
skipped row prints are the table's, and the README's glossary names every column of results.csv (and no
retired one)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import auditor
from auditor.audit.model_list import FAMILY_NAMES, MODELS, families
from auditor.audit.report.schema import COLUMNS, LEGACY_COLUMNS
from auditor.audit.report.tables import skipped_text

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
AUDITOR_DOC = (ROOT / "docs" / "auditor.md").read_text()


def _flat(text: str) -> str:
    """Prose with its line breaks as spaces (a name may wrap)."""
    return re.sub(r"\s+", " ", text)
MEMORY = (ROOT / "reports" / "benchmarks-memory.md").read_text()


def _table(text: str, header_start: str) -> list[dict[str, str]]:
    """The rows of the first markdown table whose header line starts with ``header_start``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_the_memory_of_an_audit_of_block_0_is_quoted_as_the_benchmark_measured_it():
    on_cpu = _table(MEMORY, "| blocks | parameters | on disk (GiB) | audit peak")
    cpu, blocks = [float(r["audit peak RSS (GiB)"]) for r in on_cpu], [int(r["blocks"]) for r in on_cpu]
    quoted = f"{min(cpu):.2f}-{max(cpu):.2f} GiB"
    readme, doc = _flat(README), _flat(AUDITOR_DOC)
    assert quoted in readme and quoted in doc, quoted
    assert f"from {min(blocks)} to {max(blocks)} blocks" in readme
    assert f"has {min(blocks)} or {max(blocks)} blocks" in doc
    on_gpu = _table(MEMORY, "| blocks | parameters | on disk (GiB) | audit GPU")
    gpu = [float(r["audit GPU peak (GiB)"]) for r in on_gpu]
    assert f"{min(gpu):.2f}-{max(gpu):.2f} GiB of GPU memory" in doc
    assert f"holds {max(gpu):.1f} GiB of GPU memory" in readme


def test_every_family_and_registered_name_is_in_the_documents():
    assert set(FAMILY_NAMES) == set(families(MODELS))  # a new family needs its name here and in the documents
    opening = _flat(README[: README.index("## Two commands")])
    models_section = _flat(_section(AUDITOR_DOC, "## Models, data and tokens"))
    docstring = _flat(inspect.getdoc(auditor.audit_model))
    for family, name in FAMILY_NAMES.items():
        assert name in opening, (family, "README's opening")
        assert name in models_section, (family, "docs/auditor.md, Models")
        assert name in docstring, (family, "audit_model's docstring")
    for line in MODELS:
        assert f"`{line.name}`" in models_section, line.name


def test_the_words_of_a_skipped_row_are_the_ones_the_readme_quotes():
    assert f"`{skipped_text({'note': 'weights unavailable: offline'})}`" in README
    quoted = set(re.findall(r"`(skipped: [^`]+)`", README + AUDITOR_DOC))
    notes = ("weights unavailable: offline", "N = 3 examples < k = 5", "")
    produced = {skipped_text({"note": note}) for note in notes}
    assert quoted <= produced, quoted - produced


def test_the_glossary_names_every_column_once_and_no_retired_one():
    glossary = _section(README, "## Glossary")
    names = re.findall(r"^\| ([^|]+) \|", glossary, flags=re.MULTILINE)
    named = [n for cell in names for n in re.findall(r"`([A-Za-z_]+)`", cell)]
    assert [c for c in COLUMNS if c not in named] == []
    assert not set(LEGACY_COLUMNS) & set(named)  # holds is gone: share_meets_threshold and statement
    assert len(named) == len(set(named)), [n for n in set(named) if named.count(n) > 1]
