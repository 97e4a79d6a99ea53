"""The depth profile of an audit (``depth.csv``): one row per weights x depth, read from the rows alone.

An audit across depth (``--layers``, or two or more ``block.L`` representations) summarises each
representation ``embedding`` / ``block.L`` under each weights source in one row, sorted by weights then
depth (``depth`` indexes Hugging Face's hidden_states: 0 for the embedding, L + 1 for block L):

- ``N, n, d, rtol``; for each test run, ``<test>_fraction``, ``<test>_holds`` and ``<test>_critical_rtol``
  (the tolerance at which that verdict flips, where the rows carry it);
- ``krank_estimate``: the largest tested k whose sampled full-rank share reached the threshold (n from
  Assumption 1, min(N, d) from general position, the sweep's lower estimate), 0 if none;
- ``krank_lower`` / ``krank_lower_method``: the certified lower bound on the Kruskal rank of the queries
  (from the Assumption 1 row) and how it was proven; ``krank_upper``: the smallest upper bound witnessed
  by a dependent subset of the queries (Assumption 1, general position, the sweep), empty if none;
- the token geometry (``effective_rank``, ``stable_rank``, ``anisotropy``, ``collapse_residual``) and
  the provenance columns of ``results.csv``.

``random-attention`` and representations that were not tested (skipped weights) have no row.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from auditor.assumptions import QUERY_TESTS
from auditor.config import representation_depth

DEPTH_TESTS = ("assumption1", "assumption2", "assumption3", "general_position")  # their column order
GEOMETRY_COLUMNS = ("effective_rank", "stable_rank", "anisotropy", "collapse_residual")
PROVENANCE_COLUMNS = ("threshold", "subsets", "dtype", "device", "data_source", "data_counts", "first",
                      "data_fingerprint", "tokenizer", "seed", "git_commit", "versions")
_INT = ("depth", "N", "n", "d", "krank_estimate", "krank_lower", "krank_upper", "subsets", "seed")


def _value(row: pd.Series | None, key: str) -> Any:
    """``row[key]``, None when the row or the column is missing or the cell is empty."""
    if row is None or key not in row.index:
        return None
    value = row[key]
    return None if value is None or (not isinstance(value, dict | list) and pd.isna(value)) else value


def _profile_row(group: pd.DataFrame, tests: list[str], curve: pd.DataFrame | None) -> dict[str, Any]:
    by_test = {row["test"]: row for _, row in group.iterrows()}
    first = by_test.get("assumption1", group.iloc[0])
    out: dict[str, Any] = {key: _value(first, key) for key in ("model", "weights", "representation")}
    out["depth"] = representation_depth(str(out["representation"]))
    out.update({key: _value(first, key) for key in ("N", "n", "d", "rtol")})
    for test in tests:
        row = by_test.get(test)
        out[f"{test}_fraction"] = _value(row, "fraction")
        out[f"{test}_holds"] = _value(row, "holds")
        out[f"{test}_critical_rtol"] = _value(row, "critical_rtol")
    ks = [int(_value(by_test[t], "k")) for t in QUERY_TESTS if t in by_test and _value(by_test[t], "holds") is True]
    uppers = [int(v) for t in QUERY_TESTS if (v := _value(by_test.get(t), "krank_upper")) is not None]
    if curve is not None and not curve.empty:
        ks.append(int(curve["lower_estimate"].iloc[0]))
        if pd.notna(curve["upper_bound"].iloc[0]):
            uppers.append(int(curve["upper_bound"].iloc[0]))
    a1 = by_test.get("assumption1")
    out.update(krank_estimate=max(ks, default=0), krank_lower=_value(a1, "krank_lower"),
               krank_lower_method=_value(a1, "krank_lower_method"), krank_upper=min(uppers, default=None))
    out.update({key: _value(first, key) for key in (*GEOMETRY_COLUMNS, *PROVENANCE_COLUMNS)})
    return out


def depth_frame(rows: pd.DataFrame, curves: pd.DataFrame | None = None) -> pd.DataFrame:
    """The depth profile of an audit's typed rows (and its sweep's curves), one row per weights x depth.

    Columns: model, weights, representation, depth, N, n, d, rtol, ``<test>_fraction`` / ``_holds`` /
    ``_critical_rtol`` for each test in the rows (in the order assumption1, assumption2, assumption3,
    general_position), krank_estimate, krank_lower, krank_lower_method, krank_upper, the geometry columns,
    then the provenance columns. Empty (no columns) when no row is an embedding or a block.
    """
    if rows.empty:
        return pd.DataFrame()
    ok = rows[(rows["status"] == "ok") & rows["representation"].map(lambda r: representation_depth(str(r)) is not None)]
    tests = [t for t in DEPTH_TESTS if t in set(ok["test"])]
    records = []
    for (weights, rep), group in ok.groupby(["weights", "representation"], sort=False):
        curve = None
        if curves is not None and not curves.empty:
            curve = curves[(curves["weights"] == weights) & (curves["representation"] == rep)]
        records.append(_profile_row(group, tests, curve))
    if not records:
        return pd.DataFrame()
    frame = pd.DataFrame(records)
    for key in _INT:
        frame[key] = pd.array([None if v is None or pd.isna(v) else int(v) for v in frame[key]], dtype="Int64")
    for key in [c for c in frame.columns if c.endswith("_holds")] + ["first"]:
        frame[key] = pd.array([None if v is None or pd.isna(v) else bool(v) for v in frame[key]], dtype="boolean")
    floats = ["rtol", "threshold", *GEOMETRY_COLUMNS, *(c for c in frame.columns if c.endswith(("_fraction",
                                                                                                "_critical_rtol")))]
    for key in floats:
        frame[key] = pd.to_numeric(frame[key], errors="coerce").astype("float64")
    return frame.sort_values(["weights", "depth"], kind="stable").reset_index(drop=True)
