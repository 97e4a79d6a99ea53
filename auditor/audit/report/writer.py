"""The files of an audit report: ``results.csv``, ``sweep.csv``, ``depth.csv``, ``config.json``,
``summary.md`` and plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from auditor.audit.report.catalogue import RTOL_RULE
from auditor.audit.report.schema import csv_text
from auditor.audit.report.tables import (
    ROBUST_FACTOR,
    bounds_table,
    kruskal_table,
    robustness_table,
    stage_table,
    summary_table,
    test_seconds,
)
from auditor.core.atomic import Staged

if TYPE_CHECKING:
    from auditor.audit.report.result import AuditResult


def write_report(result: AuditResult, out: Path, extra_config: dict[str, Any] | None = None) -> list[Path]:
    """Write results.csv, sweep.csv and depth.csv (if any), config.json, summary.md, the plots and
    report.html (all of it as one page) into ``out``.

    Every file is staged first and renamed into place only when all were written (a link at a target is
    replaced, never written through). ``extra_config``: more keys for config.json (e.g. the torch threads
    used). Returns the paths written; an OSError (full disk, read-only folder) leaves the folder as it was.
    """
    from auditor.audit.report.html import report_html  # the same, as one self-contained page
    from auditor.audit.report.plots import write_plots  # matplotlib: only when a report is written

    out = Path(out)
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in result.config.__dict__.items()}
    with Staged() as staged:
        svgs: dict[str, str] = {}  # the same figures for report.html, drawn once
        plots = write_plots(result, out, staged, svgs=svgs)
        if not result.curves.empty:
            staged.text(out / "sweep.csv", csv_text(result.curves))
        if not result.depth.empty:
            staged.text(out / "depth.csv", csv_text(result.depth))
        staged.text(
            out / "config.json", json.dumps({**config, **(extra_config or {})}, indent=2, default=str) + "\n"
        )
        staged.text(out / "summary.md", summary_text(result, plots))
        staged.text(out / "report.html", report_html(result, {**config, **(extra_config or {})}, svgs=svgs))
        staged.text(out / "results.csv", csv_text(result.rows))
        return staged.commit()


def _provenance_lines(result: AuditResult) -> list[str]:
    rows, config = result.rows, result.config
    ok = rows[rows["status"] == "ok"]
    first = ok.iloc[0] if not ok.empty else rows.iloc[0]

    def val(key: str) -> str:
        v = first.get(key, "")
        return "" if pd.isna(v) else str(int(v) if isinstance(v, float) and v.is_integer() else v)

    rtol = RTOL_RULE if config.rtol is None else f"{config.rtol:g}"
    taken = first.get("first")
    drawn = ("" if taken is None or pd.isna(taken) else "; examples: the first N of the source" if taken
             else f"; examples: a random draw of N (seed {config.seed})")
    lines = [
        f"- model: `{config.model}`; data: {val('data_source')}{drawn}",
        f"- tokenizer / preprocessing: {val('tokenizer')}",
        f"- N = {val('N')}, n = {val('n')}, d = {val('d')}; weights_dtype (weights held in): "
        f"{_weights_dtypes(ok)}; dtype (tokens computed in): {val('dtype')}; tests ran on: {val('device')}",
        f"- Kruskal tests: {config.subsets} random k-subsets (all of them when C(N, k) is smaller), seed "
        f"{config.seed}; threshold of the full-rank share {config.threshold:g} (Assumption 2: 1, every "
        "context)",
        f"- rank tolerance: sigma > sigma_max x rtol, rtol = {rtol}",
        f"- git commit: {val('git_commit')}; versions: {val('versions')}",
    ]
    skipped = rows[rows["status"] == "skipped"]
    for note in sorted(set(skipped["note"].astype(str))):
        lines.append(f"- skipped: {note}")
    return lines


def _weights_dtypes(ok: pd.DataFrame) -> str:
    """The dtype the weights were held in: one name, or one per weights source where they differ
    (``bfloat16 (./ckpt), float32 (random)``); ``not recorded`` for rows written before the column."""
    pairs = {}
    for weights, kind in zip(ok["weights"], ok["weights_dtype"], strict=True):
        pairs.setdefault(str(weights), "" if kind is None or pd.isna(kind) else str(kind))
    kinds = set(pairs.values()) - {""}
    if len(kinds) <= 1 and (len(kinds) == 0 or "" not in pairs.values()):
        return next(iter(kinds), "not recorded")
    return ", ".join(f"{kind or 'not recorded'} ({weights})" for weights, kind in pairs.items())


def depth_table(depth: pd.DataFrame) -> pd.DataFrame:
    """The depth profile for reading: per weights x depth, each test's statement and fraction
    (``refuted: 0.0000``), and the Kruskal rank bounds."""
    table = pd.DataFrame({"weights": depth["weights"], "representation": depth["representation"],
                          "depth": [str(v) for v in depth["depth"]]})
    for column in [c for c in depth.columns if c.endswith("_fraction")]:
        test = column.removesuffix("_fraction")
        said = depth.get(f"{test}_statement", pd.Series(None, index=depth.index, dtype=object))
        table[test] = [(f"{s}: " if isinstance(s, str) else "") + (f"{v:.4f}" if pd.notna(v) else "")
                       for s, v in zip(said, depth[column], strict=True)]

    def text(value: object) -> str:
        return "" if value is None or pd.isna(value) else str(value)

    table["Kruskal rank >= (certified)"] = [
        f"{text(v)} ({text(m)})" if text(v) else ""
        for v, m in zip(depth["krank_lower"], depth["krank_lower_method"], strict=True)
    ]
    table["sampled"] = _sampled_cells(depth)
    table["<= (witnessed)"] = [text(v) or "none found" for v in depth["krank_upper"]]
    return table


def _sampled_cells(depth: pd.DataFrame) -> list[str]:
    """The sampled Kruskal rank as an inequality (``>= 128``, ``< 128``, ``= 1``); a depth.csv written
    before ``krank_sampled`` shows its positive estimates as ``>= e`` and its 0 (no tested k held) as
    nothing, never as 0."""
    if "krank_sampled" in depth.columns:
        return ["" if v is None or pd.isna(v) else str(v) for v in depth["krank_sampled"]]
    values = pd.to_numeric(
        depth.get("krank_estimate", pd.Series(index=depth.index, dtype=float)), errors="coerce"
    )
    return [f">= {int(v)}" if pd.notna(v) and v > 0 else "" for v in values]


def _section(title: str, table: str, note: str) -> list[str]:
    """The lines of one section of summary.md: its heading, a markdown table and the note that reads it."""
    return [f"## {title}", "", table, "", note, ""]


def summary_text(result: AuditResult, plots: list[Path]) -> str:
    """The text of summary.md: the table, how it was made, the time per stage, the sweep's Kruskal ranks,
    the plots."""
    table = summary_table(result.rows)
    if result.stages.empty:  # no clock (tokens given as tensors): the tests' own seconds, from their rows
        total = float(pd.to_numeric(result.rows.get("seconds"), errors="coerce").fillna(0).sum())
        took = f"- rank tests took {total:.1f} s in total"
    else:  # the same seconds as the test stages of the table below (bounds and geometry included)
        wall = float(pd.to_numeric(result.stages["seconds"]).sum())
        took = (f"- rank tests took {test_seconds(result.stages):.1f} s of the run's {wall:.1f} s (the "
                "test stages and the sum of the time-per-stage table below)")
    stopped = getattr(result, "incomplete", None)
    lines = [
        f"# Assumption audit: {result.config.model}",
        "",
        *([f"**Incomplete**: the run stopped after the rows below, with the error: {stopped}. Rerun the "
           "same command to resume (the finished tests are reused).", ""] if stopped else []),
        table.to_markdown() if not table.empty else "(no rows)",
        "",
        "Each cell gives first the strict statement at the row's rank tolerance (Assumptions 1, 3 and "
        "general position: Kruskal rank >= k; Assumption 2: every context has rank n, column `statement`): "
        "refuted (a dependent subset, or a rank-deficient context, disproves it; its indices are the "
        "`witness` in results.csv), proven (a certified lower bound on the Kruskal rank reaches k, every "
        "k-subset was enumerated full rank, or every context has rank n) or not decided (no dependent subset "
        "was found, and none was proven impossible: sampling cannot prove the statement). Then the measured "
        "share, full-rank sampled k-subsets or rank-n contexts, and whether it meets its threshold (column "
        "`share_meets_threshold`): a share can meet the threshold while a witness refutes the statement.",
        "",
        "## How this was made",
        *_provenance_lines(result),
        took,
        "",
    ]
    robust = robustness_table(result.rows)
    if not robust.empty:
        lines += _section(
            "How much each share's comparison with its threshold depends on the rank tolerance",
            robust.to_markdown(),
            "Each fraction is monotone in the tolerance, so its comparison with the threshold flips at one "
            "critical tolerance (`critical_rtol` in results.csv, with a proven bracket `critical_rtol_low` - "
            "`critical_rtol_high` and `critical_rtol_exact`; `rtol_grid` gives the fraction from 0.1x to 10x "
            "rtol). A bracket is quoted as it was proven: one number where it is narrow (3% near rtol, 10% "
            "beyond 10x), a range marked (bound) where the work caps left it wider, 'at least' where no "
            "tolerance below 1 was proven to flip it. Robust: the comparison survives a change of rtol by "
            f"{ROBUST_FACTOR:g}x either way; otherwise it hinges on the tolerance convention and should be "
            "quoted with it. This speaks of the share only: a witness refutes the strict statement at this "
            "rtol whatever the share.",
        )
    bounds = bounds_table(result.rows)
    if not bounds.empty:
        lines += _section(
            "Kruskal rank: interval and two-sided bounds",
            bounds.to_markdown(),
            "Fraction: share of the sampled k-subsets that are full rank, with its Clopper-Pearson 95% "
            "interval. Lower bound: certified for every subset at this tolerance, by the method named "
            "(exhaustive "
            "search on small sets; else the coherence or Babel function of the normalised vectors, raw or "
            "whitened, or a null-space bound from linear programs); it can be small on real tokens and is "
            "shown as proven. Upper bound: a dependent subset was found "
            "(witness in results.csv). Duplicates: vectors equal to an earlier one / pairs with cosine "
            ">= 0.9999.",
        )
    if not result.stages.empty:
        lines += _section(
            "Time per stage",
            stage_table(result.stages).to_markdown(disable_numparse=True),
            "Setup: first imports and the checks of the options against the model. Extraction (per "
            "weights source): loading the model and the inputs, and the forward passes. Each test sums "
            "its runs over the representations (an audit across depth names each layer's tests, and the "
            "token geometry of each layer). Other: the rest of the run up to this report (the report "
            "folder, rows saved as they finish, tokens moved to the test device, and the token geometry "
            "outside an audit across depth).",
        )
    if not result.curves.empty:
        lines += _section(
            "Kruskal rank of the queries (from the sweep)",
            kruskal_table(result.curves).to_markdown(),
            "Sampled estimate: >= the largest k whose sampled subsets (and those of every smaller "
            "tested k) were all full rank (sampling cannot prove it), or < the smallest tested k when that "
            "one already failed. Upper bound: certified by a dependent subset (witness) at the next k. "
            "Bisection added the refined k between the two.",
        )
    if not result.depth.empty:
        lines += _section(
            "Across depth (depth.csv)",
            depth_table(result.depth).to_markdown(index=False, disable_numparse=True),
            "Depth 0 is the embedding, depth L + 1 the output of block L. Each test: its statement (refuted, "
            "proven, not decided), then its fraction. Kruskal rank K of the queries, "
            "as bounds: certified K >= lower (and how it was proven); sampled: >= k where the sampled "
            "k-subsets reached the threshold (sampling cannot prove it), < k where the smallest tested k "
            "failed, = K where the bounds meet; witnessed K <= upper (a dependent subset).",
        )
    if plots:
        lines += ["## Plots", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    return "\n".join(lines)
