"""Tables of an audit, as DataFrames: the Table-1 layout (representation rows x assumption columns), the
Kruskal ranks of a sweep, and the time per stage. They read rows and curves only, never files."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from auditor.audit.report.catalogue import TEST_SPECS, TEST_TITLES
from auditor.audit.report.schema import (
    PROVEN,
    REFUTED,
    critical_exact,
    parse_rank_counts,
    statement_of,
)

STAGE_COLUMNS = ("stage", "seconds", "share")
OTHER_STAGE = "other"  # wall time outside the named stages (model checks, report folder, moving tokens)


def _rank_span(counts: Any) -> str:
    """``rank 1`` or ``ranks 195-197`` from a rank histogram (dict or its CSV text)."""
    ranks = sorted(parse_rank_counts(counts) or {})
    if not ranks:
        return ""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


def skipped_text(row: pd.Series | Mapping[str, Any]) -> str:
    """Why a skipped row has no verdict, in two or three words (``skipped: weights unavailable``)."""
    note = str(row.get("note", ""))
    if note.startswith("weights unavailable"):
        return "skipped: weights unavailable"
    if note.startswith("N = "):
        return "skipped: N < k"
    return "skipped"


def percent(fraction: float) -> str:
    """A share in percent with as many decimals as it takes to keep it off 0% and 100% unless it is one."""
    value = 100 * float(fraction)
    if value in (0.0, 100.0):
        return f"{value:.0f}%"
    digits = 1
    while digits < 8 and (round(value, digits) in (0.0, 100.0)):
        digits += 1
    return f"{value:.{digits}f}%"


def statement_text(row: pd.Series | Mapping[str, Any]) -> str:
    """The strict statement of a tested row and what decided it: ``refuted: Kruskal rank < 197 (witness)``,
    ``proven: Kruskal rank >= 197 (certified)``, ``not decided: Kruskal rank >= 197``; Assumption 2:
    ``proven: all 240 contexts of rank n`` or ``refuted: 3 of 240 contexts below rank n``. "" for a row
    without a verdict."""
    statement = row.get("statement")
    if not isinstance(statement, str):
        statement = statement_of(dict(row))
    if statement is None:
        return ""
    test = TEST_SPECS.get(str(row.get("test")))
    if test is not None and not test.kruskal:
        num = int(row["N"])
        short = num - round(float(row["fraction"]) * num)
        return (f"proven: all {num} contexts of rank n" if statement == PROVEN
                else f"refuted: {short} of {num} contexts below rank n")
    k = int(row["k"])
    if statement == REFUTED:
        return f"refuted: Kruskal rank < {_refuted_below(row, k)} (witness)"
    if statement == PROVEN:
        exhaustive = _flag(row.get("exhaustive"))
        return f"proven: Kruskal rank >= {k} ({'all subsets full rank' if exhaustive else 'certified'})"
    return f"not decided: Kruskal rank >= {k}"


def _refuted_below(row: pd.Series | Mapping[str, Any], k: int) -> int:
    """The m of "Kruskal rank < m" a row's witnesses prove: k, or less where a smaller dependent subset
    was found (``krank_upper`` + 1)."""
    upper = row.get("krank_upper")
    return min(k, int(upper) + 1) if _number(upper) else k


def _number(value: Any) -> bool:
    return value is not None and not pd.isna(value)


def _flag(value: Any) -> bool:
    return value is not None and not pd.isna(value) and bool(value)


def share_text(row: pd.Series | Mapping[str, Any]) -> str:
    """The measured share with its threshold named as such: ``99.55% of 5000 sampled 197-subsets full rank,
    threshold 0.99 met``; a share below full rank adds the ranks seen. Assumption 2, whose statement already
    counts the contexts and whose threshold is all of them, gives only the ranks seen below n. "" for a row
    without a fraction."""
    fraction = row.get("fraction")
    if fraction is None or pd.isna(fraction):
        return ""
    fraction = float(fraction)
    span = _rank_span(row.get("rank_counts")) if fraction < 1 else ""
    test = TEST_SPECS.get(str(row.get("test")))
    if test is not None and not test.kruskal:
        return f"context {span}" if span else ""
    k, subsets = int(row["k"]), row.get("subsets")
    count = f"{int(subsets)} " if _number(subsets) else ""
    if _flag(row.get("exhaustive")):
        scope = f"the one {k}-subset" if count == "1 " else f"all {count}{k}-subsets"
    else:
        scope = f"{k}-subsets" if _flag(row.get("spectrum_proof")) else f"{count}sampled {k}-subsets"
    text = f"{percent(fraction)} of {scope} full rank"
    notes = [span] if span else []
    if _flag(row.get("spectrum_proof")):
        notes.append("all dependent by the pool's spectrum")
    text += f" ({'; '.join(notes)})" if notes else ""
    threshold, met = row.get("threshold"), row.get("share_meets_threshold")
    if _number(threshold):
        text += f", threshold {float(threshold):g}"
        if _number(met):
            text += " met" if bool(met) else " not met"
    return text


def cell(row: pd.Series) -> str:
    """One table cell: the strict statement first, then the share with its threshold."""
    if row.get("status") == "skipped":
        return skipped_text(row)
    return "; ".join(part for part in (statement_text(row), share_text(row)) if part)


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
    """A tolerance multiplier for reading: ``0.45x``, ``12x``, ``195445x``, ``5.8e13x``."""
    if x < 10:
        return f"{x:.2g}x"
    return f"{x:.0f}x" if x < 1e6 else f"{x:.2g}x".replace("e+0", "e").replace("e+", "e")


def _span(low: float, high: float) -> str:
    """A proven bracket of multipliers for reading: ``2.5x`` when it is narrow, else ``2-3x``."""
    if high <= low * 1.1:
        return _times((low * high) ** 0.5)
    return f"{_times(low)[:-1]}-{_times(high)}"


def robustness(row: pd.Series) -> str:
    """How far the rank tolerance can move before a row's share crosses its threshold, in words ("" when
    unknown).

    The critical tolerance c is the rtol at which the share crosses the threshold (the fraction is monotone
    in rtol): a share that meets it keeps meeting it for every rtol below c, one below it stays below above
    c. c is known within a proven bracket [low, high]; the words quote the bracket (as multiples of rtol)
    and call the comparison robust when it survives a change of the tolerance by ``ROBUST_FACTOR`` either
    way, judged on the conservative end of the bracket. They speak of the share, never of the strict
    statement (:func:`statement_text`), which a witness can refute while the share meets its threshold.
    """
    met = row.get("share_meets_threshold")
    if row.get("status") == "skipped" or met is None or pd.isna(met):
        return ""
    critical, rtol = row.get("critical_rtol"), row.get("rtol")
    if critical is None or rtol is None or pd.isna(critical) or pd.isna(rtol) or not float(rtol) > 0:
        return ""
    ratio = float(critical) / float(rtol)
    low, high = row.get("critical_rtol_low"), row.get("critical_rtol_high")
    low = ratio if low is None or pd.isna(low) else float(low) / float(rtol)
    high = ratio if high is None or pd.isna(high) else float(high) / float(rtol)
    bound = "" if _is_exact(row) is not False else " (bound)"
    if bool(met):
        word = "robust" if low >= ROBUST_FACTOR else "hinges on the tolerance"
        if high == float("inf") or _trivial_cap(high, float(rtol)):  # no tolerance was proven to make it fail
            return f"{word}: share meets the threshold at every rtol up to {_times(low)} at least"
        return f"{word}: share meets the threshold up to {_span(low, high)} rtol, falls below above{bound}"
    word = "robust" if high <= 1 / ROBUST_FACTOR else "hinges on the tolerance"
    if low <= 0:  # no positive tolerance was proven to make it meet the threshold
        if critical == 0 and _is_exact(row):
            return f"{word}: share below the threshold at every rtol float64 can resolve"
        return f"{word}: share below the threshold at every rtol down to {_times(high)} at least"
    return f"{word}: share below the threshold at rtol, meets it below {_span(low, high)} rtol{bound}"


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
    low, high = row.get("critical_rtol_low"), row.get("critical_rtol_high")
    known = not (critical is None or pd.isna(critical))
    bracket = not (low is None or high is None or pd.isna(low) or pd.isna(high))
    if rtol is None or pd.isna(rtol) or not float(rtol) > 0 or not (known or bracket):
        return ""  # (critical_rtol is empty where only its bracket is known)
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
    """One line per Kruskal row: the strict statement, the fraction with its Clopper-Pearson interval, the
    certified lower and the witnessed upper bound on the Kruskal rank, duplicates, the critical tolerance."""
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
            "statement: Kruskal rank >= k": statement_of(dict(row)) or "",
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


def test_seconds(stages: pd.DataFrame) -> float:
    """The seconds of the stages that are tests (``assumption1``, ``assumption1 (block.3)``, ...) in a
    ``stage | seconds | share`` frame: what the time-per-stage table gives the tests, bounds included."""
    if stages.empty:
        return 0.0
    names = stages["stage"].astype(str).str.split(" ").str[0]
    return float(pd.to_numeric(stages.loc[names.isin(list(TEST_SPECS)), "seconds"]).sum())


def stage_table(stages: pd.DataFrame) -> pd.DataFrame:
    """The time per stage for reading: seconds to 0.01 s, shares in percent, indexed by stage."""
    return pd.DataFrame({"seconds": [f"{s:.2f}" for s in stages["seconds"]],
                         "share": [f"{100 * s:.1f}%" for s in stages["share"]]},
                        index=pd.Index(stages["stage"], name="stage"))
