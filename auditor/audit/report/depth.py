"""The depth profile of an audit (``depth.csv``): one row per weights x depth, read from the rows alone.

An audit across depth (``--layers``, or two or more ``block.L`` representations) summarises each
representation ``embedding`` / ``block.L`` under each weights source in one row, sorted by weights then
depth (``depth`` indexes Hugging Face's hidden_states: 0 for the embedding, L + 1 for block L):

- ``N, n, d, rtol``; for each test run, ``<test>_statement`` (``refuted`` / ``proven`` / ``not decided``,
  as the row's ``statement``), ``<test>_fraction``, ``<test>_share_meets_threshold``,
  ``<test>_critical_rtol`` (the tolerance at which the share crosses its threshold, where the rows carry
  it) with its proven bracket ``<test>_critical_rtol_low`` / ``_high`` and ``<test>_critical_rtol_exact``
  (False: only bounded); a depth.csv written before had ``<test>_holds`` for the share's flag
  (:func:`read_depth` maps it);
- the Kruskal rank K of the queries, never as one number where only bounds are known:
  ``krank_lower`` / ``krank_lower_method``: certified, K >= krank_lower (from the Assumption 1 row) and
  how it was proven; ``krank_upper``: witnessed, K <= krank_upper (the smallest upper bound a dependent
  subset of the queries gives: Assumption 1, general position, the sweep), empty if none;
  ``krank_estimate``: the largest tested k whose statement "Kruskal rank >= k" no witness refutes (n from
  Assumption 1, min(N, d) from general position, the sweep's lower estimate; sampling cannot prove it) and
  that no witnessed bound lies below, empty when there is none, and K itself when the bounds meet;
  ``krank_sampled``: the same as text, ``>= 128`` (sampled), ``< 128`` (the smallest tested k failed) or
  ``= 1`` (proven);
  ``krank_exact``: the certified and witnessed bounds meet (K is known);
- the token geometry (``effective_rank``, ``stable_rank``, ``anisotropy``, raw and mean-centred
  ``*_centred``, and ``collapse_residual``) and the provenance columns of ``results.csv``.

``random-attention`` and representations that were not tested (skipped weights) have no row.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from auditor.audit.report.catalogue import QUERY_TESTS, TEST_SPECS, representation_depth
from auditor.audit.report.schema import (
    GEOMETRY_COLUMNS,
    LEGACY_COLUMNS,
    NOT_DECIDED,
    PROVEN,
    REFUTED,
    statement_of,
)

DEPTH_TESTS = ("assumption1", "assumption2", "assumption3", "general_position")  # their column order
CRITICAL_COLUMNS = (
    "critical_rtol",
    "critical_rtol_low",
    "critical_rtol_high",
    "critical_rtol_exact",
)  # per test
KRANK_COLUMNS = (
    "krank_lower",
    "krank_lower_method",
    "krank_estimate",
    "krank_sampled",
    "krank_upper",
    "krank_exact",
)
PROVENANCE_COLUMNS = ("threshold", "subsets", "dtype", "weights_dtype", "device", "data_source",
                      "data_counts", "first", "data_fingerprint", "tokenizer", "seed", "git_commit",
                      "versions")
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
        out[f"{test}_statement"] = None if row is None else statement_of(dict(row))
        out[f"{test}_fraction"] = _value(row, "fraction")
        out[f"{test}_share_meets_threshold"] = _value(row, "share_meets_threshold")
        for column in CRITICAL_COLUMNS:
            out[f"{test}_{column}"] = _value(row, column)
    tested = [t for t in QUERY_TESTS if t in by_test and _value(by_test[t], "k") is not None]
    statements = {t: statement_of(dict(by_test[t])) for t in tested}
    ks = [int(_value(by_test[t], "k")) for t in tested if statements[t] in (PROVEN, NOT_DECIDED)]
    failed = [int(_value(by_test[t], "k")) for t in tested if statements[t] == REFUTED]
    uppers = [int(v) for t in QUERY_TESTS if (v := _value(by_test.get(t), "krank_upper")) is not None]
    if curve is not None and not curve.empty:
        if pd.notna(curve["lower_estimate"].iloc[0]):  # empty where the smallest tested k failed
            ks.append(int(curve["lower_estimate"].iloc[0]))
        failed += [int(k) for k, f in zip(curve["k"], curve["fraction"], strict=True) if float(f) < 1.0]
        if pd.notna(curve["upper_bound"].iloc[0]):
            uppers.append(int(curve["upper_bound"].iloc[0]))
    a1 = by_test.get("assumption1")
    lower, upper = _value(a1, "krank_lower"), min(uppers, default=None)
    exact = lower is not None and upper is not None and int(lower) == int(upper)
    ks = [k for k in ks if upper is None or k <= upper]  # never an estimate above a witnessed bound
    estimate = int(upper) if exact else max(ks, default=None)
    if exact:
        sampled = f"= {int(upper)}"
    elif estimate is not None:
        sampled = f">= {estimate}"
    else:
        sampled = f"< {min(failed)}" if failed else None
    out.update(
        krank_lower=lower,
        krank_lower_method=_value(a1, "krank_lower_method"),
        krank_estimate=estimate,
        krank_sampled=sampled,
        krank_upper=upper,
        krank_exact=exact if lower is not None else None,
    )
    out.update({key: _value(first, key) for key in (*GEOMETRY_COLUMNS, *PROVENANCE_COLUMNS)})
    return out


def depth_frame(rows: pd.DataFrame, curves: pd.DataFrame | None = None) -> pd.DataFrame:
    """The depth profile of an audit's typed rows (and its sweep's curves), one row per weights x depth.

    Columns: model, weights, representation, depth, N, n, d, rtol, ``<test>_statement`` / ``_fraction`` /
    ``_share_meets_threshold`` /
    ``_critical_rtol`` / ``_critical_rtol_low`` / ``_critical_rtol_high`` / ``_critical_rtol_exact`` for
    each test in the rows (in the order assumption1, assumption2, assumption3, general_position), the
    Kruskal rank columns (:data:`KRANK_COLUMNS`), the geometry columns, then the provenance columns.
    Empty (no columns) when no row is an embedding or a block.
    """
    if rows.empty:
        return pd.DataFrame()
    ok = rows[
        (rows["status"] == "ok")
        & rows["representation"].map(lambda r: representation_depth(str(r)) is not None)
    ]
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
        frame[key] = pd.array(
            [None if v is None or pd.isna(v) else int(v) for v in frame[key]], dtype="Int64"
        )
    for key in [c for c in frame.columns if c.endswith(("_share_meets_threshold", "_exact"))] + ["first"]:
        frame[key] = pd.array(
            [None if v is None or pd.isna(v) else bool(v) for v in frame[key]], dtype="boolean"
        )
    floats = ["rtol", "threshold", *GEOMETRY_COLUMNS, *(c for c in frame.columns if c.endswith((
        "_fraction", "_critical_rtol", "_critical_rtol_low", "_critical_rtol_high")))]
    for key in floats:
        frame[key] = pd.to_numeric(frame[key], errors="coerce").astype("float64")
    return frame.sort_values(["weights", "depth"], kind="stable").reset_index(drop=True)


def read_depth(path: Any) -> pd.DataFrame:
    """A ``depth.csv`` as written, with the columns of files written before renamed to today's names
    (``<test>_holds`` -> ``<test>_share_meets_threshold``) and ``<test>_statement`` derived where missing
    (from the fraction and the Kruskal bounds, as :func:`statement_of` does for a row)."""
    frame = pd.read_csv(path)
    renames = {}
    for column in frame.columns:
        for old, new in LEGACY_COLUMNS.items():
            if column.endswith(f"_{old}") and column.removesuffix(old) + new not in frame.columns:
                renames[column] = column.removesuffix(old) + new
    frame = frame.rename(columns=renames)
    for test in DEPTH_TESTS:
        if f"{test}_fraction" in frame.columns and f"{test}_statement" not in frame.columns:
            frame[f"{test}_statement"] = [_old_statement(test, row) for row in frame.to_dict("records")]
    return frame


def _old_statement(test: str, row: dict[str, Any]) -> str | None:
    """The statement of one test in a depth.csv row written before ``<test>_statement``: from its fraction,
    and for the tests of the queries (whose bounds the row carries) the certified and witnessed bounds."""
    spec = TEST_SPECS[test]
    values = {key: row.get(key) for key in ("N", "n", "d")}
    k = None if any(pd.isna(v) for v in values.values()) else spec.k(*(int(v) for v in values.values()))
    queries = test in QUERY_TESTS
    return statement_of({"test": test, "status": "ok", "fraction": row.get(f"{test}_fraction"), "k": k,
                         "krank_lower": row.get("krank_lower") if queries else None,
                         "krank_upper": row.get("krank_upper") if queries else None})
