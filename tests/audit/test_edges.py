"""The audit at the edges of what the data allows: 1, 2, k - 1, k, k + 1 examples, and subset counts at
the edges of C(N, k).

A tiny random ViT (n = 17 tokens of d = 32) through the Python API on N real images: every planned test has
its row, none raises; a Kruskal test runs exactly when N >= k and then samples min(subsets, C(N, k))
subsets; the interval holds the fraction, the verdict follows the threshold, the certified and witnessed
Kruskal bounds are ordered; anisotropy (a mean over pairs) is empty for one example. One readable image
used to stop the audit ("anisotropy needs N >= 2 vectors"); it reports what one example allows.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import shared_data, tiny_vit

import auditor
from auditor.core.errors import AuditError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]
N_TOKENS, WIDTH = 17, 32  # the tiny ViT's context length n (1 + 4 x 4 patches) and width d
KRUSKAL_AT_N = ("assumption1", "assumption3")  # k = n
SUBSETS = 30


@pytest.fixture(scope="module")
def vit():
    from transformers import ViTConfig, ViTImageProcessorPil, ViTModel

    torch.manual_seed(0)
    return (ViTModel(ViTConfig(**tiny_vit()), add_pooling_layer=False),
            ViTImageProcessorPil(size={"height": 32, "width": 32}))


def image_folder(folder: Path, count: int) -> Path:
    folder.mkdir()
    for path in sorted(shared_data("imagenet-sample").glob("*.JPEG"))[:count]:
        shutil.copyfile(path, folder / path.name)
    return folder


def check_row_properties(rows: pd.DataFrame, num: int, subsets: int) -> None:
    """What every row must satisfy, whatever N is."""
    assert set(rows["status"]) <= {"ok", "skipped"}
    assert (rows["N"] == num).all() and (rows["n"] == N_TOKENS).all()
    for row in rows.to_dict("records"):
        test, k = row["test"], row["k"]
        if test in KRUSKAL_AT_N:
            assert k == N_TOKENS
            assert (row["status"] == "ok") == (num >= k), row
            if num < k:
                assert f"N = {num}" in row["note"] and f"k = {k}" in row["note"]
        elif test == "general_position":
            assert row["status"] == "ok" and k == min(num, WIDTH)
        else:  # assumption2: one rank test per context, every N >= 1
            assert test == "assumption2" and row["status"] == "ok" and row["subsets"] == num
            assert row["fraction"] * num == pytest.approx(round(row["fraction"] * num))
        if row["status"] != "ok":
            assert pd.isna(row["fraction"]) and pd.isna(row["share_meets_threshold"])
            assert row["statement"] is None
            continue
        if test != "assumption2":
            assert row["subsets"] == min(subsets, math.comb(num, k)), row
        assert row["fraction_low"] <= row["fraction"] <= row["fraction_high"]
        assert 0.0 <= row["fraction"] <= 1.0
        assert bool(row["share_meets_threshold"]) == (row["fraction"] >= row["threshold"])
        if row["subsets"] == math.comb(num, k) and test != "assumption2":  # every subset tested: no doubt
            assert row["fraction_low"] == row["fraction"] == row["fraction_high"]
        lower, upper = row["krank_lower"], row["krank_upper"]
        if not pd.isna(lower) and not pd.isna(upper):
            assert lower <= upper
    assert rows["anisotropy"].isna().all() == (num == 1)
    assert rows["effective_rank"].notna().all()


@pytest.mark.parametrize("num", [1, 2, N_TOKENS - 1, N_TOKENS, N_TOKENS + 1])
def test_the_audit_reports_what_n_examples_allow(vit, tmp_path, num):
    model, processor = vit
    data = image_folder(tmp_path / "images", num)
    rows = auditor.audit_model(
        model,
        processor,
        data=str(data),
        samples=num,
        first=True,
        representations="block.0",
        subsets=SUBSETS,
        device="cpu",
        progress=False,
        out=tmp_path / "report" if num <= 2 else None,
    )  # the report's plots with one or two examples
    planned = {"assumption1", "assumption2", "assumption3", "general_position"}
    assert set(rows["test"]) == planned and len(rows) == len(planned)
    check_row_properties(rows, num, SUBSETS)
    if num <= 2:
        assert (tmp_path / "report" / "summary.md").is_file() and (
            tmp_path / "report" / "results.csv"
        ).is_file()


def test_one_readable_image_among_unreadable_files_is_audited(vit, tmp_path):
    model, processor = vit
    data = image_folder(tmp_path / "images", 1)
    (data / "broken.JPEG").write_bytes(b"not an image")
    options = dict(representations="embedding", tests="assumption2,general_position", subsets=SUBSETS,
                   device="cpu", progress=False)
    with pytest.raises(AuditError, match=r"--samples 2 asks for more examples than the data gives: 1 "
                                         r"\(readable images\).*valid: --samples <= 1"):
        auditor.audit_model(model, processor, data=str(data), samples=2, **options)  # asked, not given
    rows = auditor.audit_model(model, processor, data=str(data), samples=1, **options)  # the advice
    assert (rows["N"] == 1).all() and set(rows["status"]) == {"ok"}
    rows = auditor.audit_model(model, processor, data=str(data), **options)  # no --samples: what there is
    assert (rows["N"] == 1).all()
    assert rows["anisotropy"].isna().all()


@pytest.mark.parametrize("num", [1, 2, 5, 6, 7])
def test_subset_counts_at_the_edges_of_all_subsets(num):
    """Tokens held by the caller (n = 5, d = 6): for each N around k = n and d, ask for 1, C - 1, C and C + 1
    subsets (C = C(N, k)); the test samples min(subsets, C) and all rows keep their properties."""
    n, d = 5, 6
    gen = torch.Generator().manual_seed(num)
    contexts = torch.randn(num, n, d, generator=gen, dtype=torch.float64)  # (N, n, d)
    queries = contexts[:, 0].clone()  # (N, d)
    total = math.comb(num, n) if num >= n else 0
    for subsets in sorted({1, max(total - 1, 1), max(total, 1), total + 1}):
        rows = auditor.audit_tokens(contexts, queries, subsets=subsets, seed=0, progress=False)
        for row in rows.to_dict("records"):
            if row["test"] in KRUSKAL_AT_N:
                assert (row["status"] == "ok") == (num >= n)
            if row["status"] == "ok" and row["test"] != "assumption2":
                assert row["subsets"] == min(subsets, math.comb(num, row["k"])), (subsets, row)
                assert row["fraction_low"] <= row["fraction"] <= row["fraction_high"]
                assert bool(row["share_meets_threshold"]) == (row["fraction"] >= row["threshold"])
        assert rows["anisotropy"].isna().all() == (num == 1)
