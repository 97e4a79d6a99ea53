"""Paper B's claims as tables: argmax inflation and which tau tracks rank (known-answer frames)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from auditor.core.errors import AuditError
from auditor.lab.facts.claims import argmax_inflation, tau_tracking, write_claims
from auditor.lab.facts.plots import plot_argmax, plot_tau_tracking


def _tau_rows():
    # rank(D) = 20; layers with bounds 10 and 40 (they can hold 10 and 20)
    rows = []
    for tau, ranks in ((0.5, (30, 35)), (0.9, (12, 20)), (0.99, (3, 5))):
        for bound, s_rank in zip((10, 40), ranks):
            rows.append(
                {"tau": tau, "s_cp_rank": s_rank, "layer_bound": bound, "acc_tau": 1 - tau / 2, "cp_rank": 20}
            )
    return pd.DataFrame(rows)


def test_tau_tracking_finds_the_threshold_closest_to_the_holdable_rank(tmp_path):
    table = tau_tracking(_tau_rows()).set_index("tau")
    assert table.loc[0.5, "gap"] == pytest.approx(((30 - 10) + (35 - 20)) / 2 / 20)
    assert table.loc[0.9, "gap"] == pytest.approx((2 + 0) / 2 / 20)
    assert (
        table.loc[0.5, "inflated"] == 0.5
        and table.loc[0.9, "inflated"] == 0.5
        and table.loc[0.99, "inflated"] == 0
    )
    assert list(table.index[table["best"]]) == [0.9]
    assert tau_tracking(_tau_rows(), rank=40).set_index("tau").loc[0.9, "gap"] == pytest.approx(
        (2 + 20) / 2 / 40
    )
    assert (tmp_path / "tau_tracking.png") in plot_tau_tracking(tau_tracking(_tau_rows()), tmp_path)


def test_argmax_inflation_counts_seeds_that_store_everything(tmp_path):
    config = json.dumps({"lr": 0.01, "steps": 2000})
    frame = pd.DataFrame(
        {
            "d_model": [5, 5, 5, 8],
            "heads": 1,
            "d_qk": [5, 5, 5, 8],
            "d_vo": [4, 4, 4, 4],
            "seed": [0, 1, 2, 0],
            "accuracy": [1.0, 0.9, 1.0, 0.5],
            "facts_stored": [200, 180, 200, 100],
            "layer_bound": [10, 10, 10, 10],
            "train_config": config,
        }
    )
    table = argmax_inflation(frame, rank=83).set_index("d_model")
    assert table.loc[5, "all_facts"] == "2/3" and table.loc[5, "accuracy_best"] == 1.0
    assert (
        table.loc[5, "accuracy_mean"] == pytest.approx(2.9 / 3) and table.loc[8, "facts_stored_best"] == 100
    )
    assert (table["lr"] == 0.01).all() and (table["rank_D"] == 83).all()
    assert (tmp_path / "argmax.png") in plot_argmax(table.reset_index(), tmp_path)
    with pytest.raises(AuditError, match="--layer-rank"):
        argmax_inflation(frame.drop(columns="layer_bound"), rank=83)


def test_write_claims_builds_both_tables_from_run_folders(tmp_path):
    config = json.dumps({"lr": 0.03})
    for name in ("tau-a", "tau-b"):
        (tmp_path / name).mkdir()
        _tau_rows().assign(train_config=config).to_csv(tmp_path / name / "results.csv", index=False)
    paths = write_claims([], [tmp_path / "tau-a", tmp_path / "tau-b"], tmp_path / "out", rank=20)
    table = pd.read_csv(tmp_path / "out" / "tau_tracking.csv")
    assert len(table) == 6 and set(table["run"]) == {"tau-a", "tau-b"} and (table["lr"] == 0.03).all()
    assert (tmp_path / "out" / "tau_tracking.png") in paths
