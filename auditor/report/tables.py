"""Tables of an audit: the Table-1 layout (representation rows x assumption columns) and the files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from auditor.atomic import Staged
from auditor.report.schema import csv_text, parse_rank_counts

if TYPE_CHECKING:
    from auditor.runner import AuditResult

TEST_TITLES = {
    "assumption2": "Assumption 2 (rank n per context)",
    "assumption1": "Assumption 1 (Kruskal, k = n)",
    "assumption3": "Assumption 3 (query + mean context)",
    "general_position": "General position (k = min(N, d))",
}


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
    if row["test"] == "assumption2":
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


def _provenance_lines(result: AuditResult) -> list[str]:
    rows, config = result.rows, result.config
    ok = rows[rows["status"] == "ok"]
    first = ok.iloc[0] if not ok.empty else rows.iloc[0]

    def val(key: str) -> str:
        v = first.get(key, "")
        return "" if pd.isna(v) else str(int(v) if isinstance(v, float) and v.is_integer() else v)

    rtol = "max(k, d) x eps of the token dtype" if config.rtol is None else f"{config.rtol:g}"
    taken = first.get("first")
    drawn = ("" if taken is None or pd.isna(taken) else "; examples: the first N of the source" if taken
             else f"; examples: a random draw of N (seed {config.seed})")
    lines = [
        f"- model: `{config.model}`; data: {val('data_source')}{drawn}",
        f"- tokenizer / preprocessing: {val('tokenizer')}",
        f"- N = {val('N')}, n = {val('n')}, d = {val('d')}; token dtype: {val('dtype')}; tests ran on: {val('device')}",
        f"- Kruskal tests: {config.subsets} random k-subsets (all of them when C(N, k) is smaller), seed "
        f"{config.seed}; holds at >= {config.threshold:g} full rank (Assumption 2: every context)",
        f"- rank tolerance: sigma > sigma_max x rtol, rtol = {rtol}",
        f"- git commit: {val('git_commit')}; versions: {val('versions')}",
    ]
    skipped = rows[rows["status"] == "skipped"]
    for note in sorted(set(skipped["note"].astype(str))):
        lines.append(f"- skipped: {note}")
    return lines


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


REPORT_FILES = ("results.csv", "sweep.csv", "config.json", "summary.md")


def write_report(result: AuditResult, out: Path, extra_config: dict[str, Any] | None = None) -> list[Path]:
    """Write results.csv, sweep.csv (if any), config.json, summary.md and the plots into ``out``.

    Every file is staged first and renamed into place only when all were written (a link at a target is
    replaced, never written through). ``extra_config``: more keys for config.json (e.g. the torch threads
    used). Returns the paths written; an OSError (full disk, read-only folder) leaves the folder as it was.
    """
    from auditor.report.plots import write_plots

    out = Path(out)
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in result.config.__dict__.items()}
    with Staged() as staged:
        plots = write_plots(result, out, staged)
        if not result.curves.empty:
            staged.text(out / "sweep.csv", csv_text(result.curves))
        staged.text(out / "config.json", json.dumps({**config, **(extra_config or {})}, indent=2, default=str) + "\n")
        staged.text(out / "summary.md", _summary(result, plots))
        staged.text(out / "results.csv", csv_text(result.rows))
        return staged.commit()


def _summary(result: AuditResult, plots: list[Path]) -> str:
    """The text of summary.md: the table, how it was made, the sweep's Kruskal ranks, the plots."""
    table = summary_table(result.rows)
    total = float(pd.to_numeric(result.rows.get("seconds"), errors="coerce").fillna(0).sum())
    lines = [
        f"# Assumption audit: {result.config.model}",
        "",
        table.to_markdown() if not table.empty else "(no rows)",
        "",
        "Fractions are the share of full-rank sampled k-subsets (Assumptions 1, 3, general position) or of "
        "rank-n contexts (Assumption 2); an assumption holds when the share reaches the threshold. A Kruskal "
        "test that fails comes with a witness subset in results.csv.",
        "",
        "## How this was made",
        *_provenance_lines(result),
        f"- rank tests took {total:.1f} s in total",
        "",
    ]
    if not result.curves.empty:
        lines += ["## Kruskal rank of the queries (from the sweep)", "", kruskal_table(result.curves).to_markdown(),
                  "", "Lower estimate: the largest k whose sampled subsets (and those of every smaller tested k) "
                  "were all full rank; sampling cannot prove it. Upper bound: certified by a dependent subset "
                  "(witness) at the next k. Bisection added the refined k between the two.", ""]
    if plots:
        lines += ["## Plots", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    return "\n".join(lines)
