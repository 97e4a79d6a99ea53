"""``audit memorize shared-queries``: the data, a real training run through the command, resume and bits."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from auditor.cli import main
from auditor.core.errors import AuditError
from auditor.lab.bits import bits_table
from auditor.lab.common.mha.data import DataConfig
from auditor.lab.memorize.shared_queries import shared_query_data
from auditor.lab.room import get

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def test_every_example_asks_one_of_the_shared_queries_with_a_context_of_its_own():
    config = DataConfig(N=10, context=3, d=5, classes=7, shared_context=False, seed=4)
    data = shared_query_data(config, 4)
    assert data.queries.shape == (10, 5) and data.contexts.shape == (10, 3, 5) and not data.shared
    assert torch.unique(data.queries, dim=0).shape[0] == 4
    for t in range(10):
        assert torch.equal(data.queries[t], data.queries[t % 4])  # example t asks query t mod Q
    assert torch.unique(data.contexts.reshape(10, -1), dim=0).shape[0] == 10
    assert data.labels.shape == (10,) and int(data.labels.max()) < 7
    again = shared_query_data(config, 4)
    assert torch.equal(again.queries, data.queries) and torch.equal(again.labels, data.labels)  # seeded
    one = shared_query_data(config, 1)
    assert torch.unique(one.queries, dim=0).shape[0] == 1
    with pytest.raises(AuditError, match="queries"):
        shared_query_data(config, 11)


def test_a_quick_run_trains_reports_the_memorized_fraction_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "memorize",
        "shared-queries",
        "--heads",
        "1,2",
        "--context",
        "4",
        "--d-h",
        "8",
        "--N",
        "32",
        "--queries",
        "1,4",
        "--d",
        "8",
        "--seeds",
        "0",
        "--steps",
        "100",
        "--lr",
        "3e-2",
        "--batch-size",
        "32",
        "--eval-every",
        "20",
        "--rounds",
        "2",
        "--no-plots",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "memorized_fraction" in printed
    frame = pd.read_csv(out / "results.csv")
    assert (
        len(frame) == 4 and sorted(set(frame["queries"])) == [1, 4] and sorted(set(frame["heads"])) == [1, 2]
    )
    assert frame["shared_queries"].all() and not frame["shared_context"].any()
    assert frame["memorized"].between(0, 32).all()
    assert (frame["accuracy"] == frame["memorized"] / 32).all()  # k / 32 is exact in binary
    assert frame["memorized"].max() >= 16  # trained: far above chance (32 random labels of 100 classes)
    assert frame["unit"].nunique() == 2  # one bucket per Q
    summary = pd.read_csv(out / "summary.csv")
    assert {"queries", "heads", "memorized_mean", "memorized_fraction", "seeds", "runs"} <= set(summary)
    stamp = {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()}
    assert main(args) == 0  # every unit done: read back, not retrained
    assert {p.name: p.stat().st_mtime_ns for p in (out / "units").iterdir()} == stamp
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), frame)
    bits = bits_table([out])
    assert set(bits["experiment"]) == {"memorize shared-queries"} and len(bits) == 4


def test_the_experiment_is_registered_in_its_room_and_refuses_bad_queries(tmp_path, capsys):
    experiment = get("memorize shared-queries")
    assert experiment.name == "memorize shared-queries" and {"queries", "shared_queries"} <= set(
        experiment.columns
    )
    assert main(["memorize", "shared-queries", "--queries", "0", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--queries" in err and err.count("\n") == 1
    assert not (tmp_path / "bad").exists()
    assert (
        main(["memorize", "--heads", "2", "shared-queries", "--out", str(tmp_path / "bad")]) == 2
    )  # misplaced
    err = capsys.readouterr().err
    assert "--heads before 'shared-queries'" in err and err.count("\n") == 1
    assert not (tmp_path / "bad").exists()
