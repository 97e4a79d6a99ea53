"""The catalogue: one declaration per assumption test, from which the audit's table, its streamed contexts,
its rows and the schema are derived; one reader of ``block.L``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from auditor.audit.assumptions import ASSUMPTION_TESTS
from auditor.audit.report.catalogue import (
    TEST_COLUMNS,
    TEST_SPECS,
    block_index,
    block_name,
    representation_depth,
)
from auditor.audit.report.schema import COLUMNS
from auditor.audit.report.style import depth_of

AUDITOR = Path(__file__).resolve().parents[2] / "auditor"


def test_the_audits_table_is_the_catalogue():
    assert ASSUMPTION_TESTS is TEST_SPECS
    for name, test in TEST_SPECS.items():
        assert test.name == name
        assert (test.streamed is not None) == test.needs_contexts, name  # a context test streams
        assert (test.tested is not None) == test.kruskal, name  # a Kruskal test names what it samples


def test_every_declared_column_is_in_the_schema():
    assert set(TEST_COLUMNS) <= set(COLUMNS) and len(COLUMNS) == len(set(COLUMNS))


def test_a_declaration_missing_a_form_or_its_vectors_is_refused():
    spec = TEST_SPECS["assumption3"]
    with pytest.raises(ValueError, match="needs the contexts, so it needs a streamed form"):
        dataclasses.replace(spec, streamed=None)
    with pytest.raises(ValueError, match="a Kruskal test samples 'queries' or 'mixed'"):
        dataclasses.replace(spec, tested=None)
    with pytest.raises(ValueError, match="k rule 'N' of assumption3 is not one of"):
        dataclasses.replace(spec, k_rule="N")
    with pytest.raises(ValueError, match=r"reduces its contexts to some of \('ranks', 'means'\)"):
        dataclasses.replace(spec, reduces=("contexts",))
    with pytest.raises(ValueError, match="reduces its contexts"):
        dataclasses.replace(spec, reduces=())


@pytest.mark.parametrize(("name", "index"), [("block.0", 0), ("block.11", 11), ("block.-1", -1),
                                              ("embedding", None), ("random-attention", None),
                                              ("block.x", None), ("block.3 ", None), ("blocks.3", None)])
def test_block_names_have_one_reader(name, index):
    assert block_index(name) == index
    if index is not None:
        assert block_name(index) == name


def test_the_depths_of_the_tables_and_the_figures_agree():
    for name in ("embedding", "block.0", "block.11", "block.-1", "x"):
        assert depth_of(name) == representation_depth(name), name
    assert (representation_depth("random-attention"), depth_of("random-attention")) == (0, None)
    assert [representation_depth(n) for n in ("block.0", "block.11", "block.-1")] == [1, 12, None]


def test_no_other_module_reads_block_names_with_its_own_pattern():
    pattern = re.compile(r"re\.(?:compile|match|fullmatch|search)\(\s*r?[\"'][^\"']*block")
    readers = [str(p.relative_to(AUDITOR)) for p in AUDITOR.rglob("*.py") if pattern.search(p.read_text())]
    assert readers == ["audit/report/catalogue.py"]


def test_the_schema_is_generated_from_the_typed_row(tmp_path):
    import torch

    import auditor
    from auditor.audit.report.schema import (
        BOOL_COLUMNS,
        FLOAT_COLUMNS,
        GEOMETRY_COLUMNS,
        INT_COLUMNS,
        Row,
        csv_text,
        read_rows,
    )

    names = [f.name for f in dataclasses.fields(Row)]
    assert names == COLUMNS and tuple(names[names.index("effective_rank"):][:7]) == GEOMETRY_COLUMNS
    gen = torch.Generator().manual_seed(0)
    e = torch.randn(12, 3, 5, generator=gen)  # (N, n, d)
    frame = auditor.audit_tokens(e, e[:, 0].clone(), subsets=40, progress=False)
    assert {c: str(frame[c].dtype) for c in INT_COLUMNS} == dict.fromkeys(INT_COLUMNS, "Int64")
    assert {c: str(frame[c].dtype) for c in BOOL_COLUMNS} == dict.fromkeys(BOOL_COLUMNS, "boolean")
    assert {c: str(frame[c].dtype) for c in FLOAT_COLUMNS} == dict.fromkeys(FLOAT_COLUMNS, "float64")
    path = tmp_path / "results.csv"
    path.write_text(csv_text(frame))
    read = read_rows(path)
    for given, back in zip(frame.to_dict("records"), read.to_dict("records"), strict=True):
        row = Row.of(given)
        assert isinstance(row.k, int) and isinstance(row.share_meets_threshold, bool)
        assert isinstance(row.rank_counts, dict) and row.test in TEST_SPECS
        assert Row.of(back) == row  # the CSV text gives back the typed row
