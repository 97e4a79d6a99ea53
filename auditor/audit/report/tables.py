"""Tables of an audit, as DataFrames: the Table-1 layout (representation rows x assumption columns), the
Kruskal ranks of a sweep, and the time per stage. They read rows and curves only, never files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from auditor.audit.report.catalogue import TEST_SPECS, TEST_TITLES
from auditor.audit.report.schema import critical_exact, parse_rank_counts

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
    test = TEST_SPECS.get(row["test"])
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
    frame = rows.assign(
        row=rows["representation"] + " @ " + rows["weights"].astype(str), cell=rows.apply(cell, axis=1)
    )
    table = frame.pivot_table(index="row", columns="test", values="cell", aggfunc="first", sort=False)
    cols = [t for t in TEST_TITLES if t in table.columns]
    return table[cols].rename(columns=TEST_TITLES).rename_axis(index="representation @ weights", columns=None)


ROBUST_FACTOR = 3.0  # a verdict is robust when it survives this factor of change in rtol, either way


def _times(x: float) -> str:
    """A tolerance multiplier for reading: ``0.45x``, ``12x``."""
    return f"{x:.2g}x" if x < 10 else f"{x:.0f}x"


def _span(low: float, high: float) -> str:
    """A proven bracket of multipliers for reading: ``2.5x`` when it is narrow, else ``2-3x``."""
    if high <= low * 1.1:
        return _times((low * high) ** 0.5)
    return f"{_times(low)[:-1]}-{_times(high)}"


def robustness(row: pd.Series) -> str:
    """How far the rank tolerance can move before a row's verdict flips, in words ("" when unknown).

    The critical tolerance c is the rtol at which the verdict flips (the fraction is monotone in rtol):
    a verdict that holds keeps holding for every rtol below c, one that fails keeps failing above it.
    c is known within a proven bracket [low, high]; the words quote the bracket (as multiples of rtol)
    and call a verdict robust when it survives a change of the tolerance by ``ROBUST_FACTOR`` either way,
    judged on the conservative end of the bracket.
    """
    if row.get("status") == "skipped" or pd.isna(row.get("holds")):
        return ""
    critical, rtol = row.get("critical_rtol"), row.get("rtol")
    if critical is None or rtol is None or pd.isna(critical) or pd.isna(rtol) or not float(rtol) > 0:
        return ""
    ratio = float(critical) / float(rtol)
    low, high = row.get("critical_rtol_low"), row.get("critical_rtol_high")
    low = ratio if low is None or pd.isna(low) else float(low) / float(rtol)
    high = ratio if high is None or pd.isna(high) else float(high) / float(rtol)
    bound = "" if _is_exact(row) is not False else " (bound)"
    if bool(row["holds"]):
        word = "robust" if low >= ROBUST_FACTOR else "hinges on the tolerance"
        if high == float("inf") or _trivial_cap(high, float(rtol)):  # no tolerance was proven to make it fail
            return f"{word}: holds at every rtol up to {_times(low)} at least"
        return f"{word}: holds up to {_span(low, high)} rtol, fails above{bound}"
    word = "robust" if high <= 1 / ROBUST_FACTOR else "hinges on the tolerance"
    if low <= 0:  # no positive tolerance was proven to make it hold
        if critical == 0 and _is_exact(row):
            return f"{word}: fails at every rtol float64 can resolve"
        return f"{word}: fails at every rtol down to {_times(high)} at least"
    return f"{word}: fails at rtol, holds below {_span(low, high)} rtol{bound}"


def _trivial_cap(high: float, rtol: float) -> bool:
    """The upper end of a bracket (as a multiple of rtol) is only the trivial cap: no sigma_k / sigma_1
    exceeds 1, so every verdict fails at rtol >= 1; such an end is no measurement."""
    return high * rtol >= 1 * (1 - 1e-9)


def _is_exact(row: pd.Series) -> bool | None:
    """``critical_rtol_exact`` of a row, or from its bracket when the row predates the column."""
    value = row.get("critical_rtol_exact")
    if value is not None and not pd.isna(value):
        return bool(value)
    return critical_exact(dict(row))


def robustness_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Representation x test table of :func:`robustness` (empty when no row has a critical tolerance)."""
    if rows.empty or "critical_rtol" not in rows or rows["critical_rtol"].isna().all():
        return pd.DataFrame()
    frame = rows.assign(row=rows["representation"] + " @ " + rows["weights"].astype(str),
                        cell=rows.apply(robustness, axis=1))
    table = frame.pivot_table(index="row", columns="test", values="cell", aggfunc="first", sort=False)
    cols = [t for t in TEST_TITLES if t in table.columns]
    return table[cols].rename(columns=TEST_TITLES).rename_axis(index="representation @ weights", columns=None)


def interval_cell(row: pd.Series) -> str:
    """``0.9990 [0.9971, 0.9998]``: a Kruskal row's fraction with its 95% interval ("" without one)."""
    low, high = row.get("fraction_low"), row.get("fraction_high")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return ""
    return f"{float(row['fraction']):.4f} [{float(low):.4f}, {float(high):.4f}]"


def critical_cell(row: pd.Series) -> str:
    """A row's critical tolerance as a multiple of its rtol, quoted as it was proven: ``2.5x`` (narrow
    bracket), ``2-3x (bound)`` (a wider proven bracket), ``>= 14x`` (no tolerance below 1 proven to
    flip it), ``<= 0.1x`` (none above 0 proven to), ``0 (no rtol resolves it)``; "" without one."""
    critical, rtol = row.get("critical_rtol"), row.get("rtol")
    if critical is None or rtol is None or pd.isna(critical) or pd.isna(rtol) or not float(rtol) > 0:
        return ""
    return _bracket_cell(row)


def _bracket_cell(row: pd.Series) -> str:
    rtol = float(row["rtol"])
    low, high = row.get("critical_rtol_low"), row.get("critical_rtol_high")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return _times(float(row["critical_rtol"]) / rtol)
    low, high = float(low) / rtol, float(high) / rtol
    if high == float("inf") or _trivial_cap(high, rtol):
        return f">= {_times(low)}"
    if low <= 0:
        return (
            "0 (no rtol resolves it)"
            if float(row["critical_rtol"]) == 0 and _is_exact(row)
            else f"<= {_times(high)}"
        )
    return _span(low, high) + ("" if _is_exact(row) is not False else " (bound)")


def bounds_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One line per Kruskal row: fraction with its Clopper-Pearson interval, the certified lower and the
    witnessed upper bound on the Kruskal rank, duplicates, the critical tolerance."""
    if rows.empty or "fraction_low" not in rows:
        return pd.DataFrame()
    keep = rows[(rows["status"] == "ok") & rows["test"].map(lambda t: t in TEST_SPECS
                                                             and TEST_SPECS[t].kruskal)]
    out = []
    for _, row in keep.iterrows():
        lower, method, upper = row.get("krank_lower"), row.get("krank_lower_method"), row.get("krank_upper")
        out.append({
            "representation @ weights": f"{row['representation']} @ {row['weights']}",
            "test": row["test"], "k": int(row["k"]),
            "fraction [95% CI]": interval_cell(row) or f"{float(row['fraction']):.4f}",
            "Kruskal rank >= (certified)": "" if pd.isna(lower) else f"{int(lower)} ({method})",
            "Kruskal rank <= (witness)": "" if pd.isna(upper) else str(int(upper)),
            "duplicates / near": "" if pd.isna(row.get("duplicates")) else
            f"{int(row['duplicates'])} / {int(row['near_duplicates'])}",
            "critical rtol / rtol": critical_cell(row),
        })
    return pd.DataFrame(out).set_index("representation @ weights") if out else pd.DataFrame()


def kruskal_table(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per representation @ weights: the sweep's sampled estimate as an inequality (``>= k``, or
    ``< k`` where the smallest tested k already failed, never 0) and its certified upper bound."""
    rows = []
    for (rep, weights), frame in curves.groupby(["representation", "weights"], sort=False):
        upper = frame["upper_bound"].iloc[0]
        refined = frame.loc[frame.get("refined", pd.Series(False, index=frame.index)).astype(bool), "k"]
        lower = frame["lower_estimate"].iloc[0]  # empty (NaN) where the smallest tested k failed
        failed = frame.loc[pd.to_numeric(frame["fraction"], errors="coerce") < 1.0, "k"]
        estimate = (
            f">= {int(lower)}" if pd.notna(lower) else (f"< {int(failed.min())}" if len(failed) else "")
        )
        rows.append(
            {
                "representation @ weights": f"{rep} @ {weights}",
                "sampled estimate": estimate,
                "certified upper bound": "none found" if pd.isna(upper) else int(upper),
                "k tested": len(frame),
                "refined k": " ".join(str(int(k)) for k in sorted(refined)) or "-",
            }
        )
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
