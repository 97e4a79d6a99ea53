"""Tables of an audit, as DataFrames: the Table-1 layout (representation rows x assumption columns), the
Kruskal ranks of a sweep, and the time per stage. They read rows and curves only, never files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from auditor.assumptions import ASSUMPTION_TESTS, TEST_TITLES
from auditor.report.schema import parse_rank_counts

STAGE_COLUMNS = ("stage", "seconds", "share")
OTHER_STAGE = "other"  # wall time outside the named stages (model checks, report folder, moving tokens)


def _rank_span(counts: Any) -> str:
    """``rank 1`` or ``ranks 195-197`` from a rank histogram (dict or its CSV text)."""
    ranks = sorted(parse_rank_counts(counts) or {})
    if not ranks:
        return ""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


def cell(row: pd.Series) -> str:
    """One table cell: verdict, fraction and, where it failed, the ranks seen."""
    if row.get("status") == "skipped":
        note = str(row.get("note", ""))
        if note.startswith("weights unavailable"):
            return "skipped: no weights"
        if note.startswith("N = "):
            return "skipped: N < k"
        return "skipped"
    mark = "holds" if bool(row["holds"]) else "fails"
    test = ASSUMPTION_TESTS.get(row["test"])
    if test is not None and not test.kruskal:  # every context tested: say how many reached rank n
        full = round(float(row["fraction"]) * int(row["N"]))
        text = f"{mark}: {full}/{int(row['N'])} rank n"
    else:
        text = f"{mark}: {float(row['fraction']):.4f}"
    if not bool(row["holds"]):
        span = _rank_span(row.get("rank_counts"))
        text += f" ({span})" if span else ""
    return text


def summary_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Representation x test table (the layout of paper A's Table 1)."""
    if rows.empty:
        return pd.DataFrame()
    frame = rows.assign(row=rows["representation"] + " @ " + rows["weights"].astype(str), cell=rows.apply(cell, axis=1))
    table = frame.pivot_table(index="row", columns="test", values="cell", aggfunc="first", sort=False)
    cols = [t for t in TEST_TITLES if t in table.columns]
    return table[cols].rename(columns=TEST_TITLES).rename_axis(index="representation @ weights", columns=None)


def kruskal_table(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per representation @ weights: the sweep's lower estimate and certified upper bound."""
    rows = []
    for (rep, weights), frame in curves.groupby(["representation", "weights"], sort=False):
        upper = frame["upper_bound"].iloc[0]
        refined = frame.loc[frame.get("refined", pd.Series(False, index=frame.index)).astype(bool), "k"]
        rows.append({"representation @ weights": f"{rep} @ {weights}",
                     "lower estimate": int(frame["lower_estimate"].iloc[0]),
                     "certified upper bound": "none found" if pd.isna(upper) else int(upper),
                     "k tested": len(frame), "refined k": " ".join(str(int(k)) for k in sorted(refined)) or "-"})
    return pd.DataFrame(rows).set_index("representation @ weights")


def stage_frame(seconds: Mapping[str, float], wall: float) -> pd.DataFrame:
    """``stage | seconds | share`` from the seconds of each named stage and the run's wall time.

    The time outside the named stages is the ``other`` stage, so the shares add up to 1.
    """
    named = {stage: max(0.0, float(s)) for stage, s in seconds.items()}
    named[OTHER_STAGE] = named.get(OTHER_STAGE, 0.0) + max(0.0, float(wall) - sum(named.values()))
    total = sum(named.values())
    return pd.DataFrame({"stage": list(named), "seconds": list(named.values()),
                         "share": [s / total if total > 0 else 0.0 for s in named.values()]},
                        columns=list(STAGE_COLUMNS))


def stage_table(stages: pd.DataFrame) -> pd.DataFrame:
    """The time per stage for reading: seconds to 0.01 s, shares in percent, indexed by stage."""
    return pd.DataFrame({"seconds": [f"{s:.2f}" for s in stages["seconds"]],
                         "share": [f"{100 * s:.1f}%" for s in stages["share"]]},
                        index=pd.Index(stages["stage"], name="stage"))
