"""``audit compare REPORT...``: the verdicts of several audit reports side by side.

A REPORT is a report folder (holding the ``results.csv`` an audit wrote, maybe a ``depth.csv``) or a model
name, which stands for the folder under ``reports/`` (in the current directory) holding the newest audit of
exactly that model (``gpt2`` never picks a ``gpt2-large`` report). Every report is checked before any work:
an empty, truncated or edited CSV, or a lab sweep's results, is refused with one line naming the file.
The comparison says first what each report measured (``compare.md``'s "Reports" table, also printed: the
model, the data as given, N, n, d, the weights sources tested and the rows it skipped, folded into one cell
per report) and then one row per report, weights, representation and test that was tested (``compare.csv``
and ``compare.md``): k, the strict statement (``statement``: refuted / proven / not decided), the fraction
with its 95% interval, the threshold and whether the share meets it (``share_meets_threshold``), and the
critical rtol (the tolerance at which the share crosses the threshold). Overlay figures: the fractions of
every test across the reports, the statements marked (``compare_kruskal.png``), and, where reports have a
``depth.csv``, their depth profiles overlaid (``compare_depth.png``). Reports written before a column existed
still compare: its cells stay empty (a report with ``holds`` reads it as ``share_meets_threshold`` and gets
its statements from its rows).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import pandas as pd

from auditor.audit.report.html import compare_html
from auditor.audit.report.schema import (
    BOOL_COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    LEGACY_COLUMNS,
    STATEMENTS,
    parse_rank_counts,
    parse_rtol_grid,
    parse_witness,
    read_rows,
)
from auditor.audit.report.schema import COLUMNS as SCHEMA_COLUMNS
from auditor.core.atomic import Staged, check_output_folder, confined, real_folder
from auditor.core.errors import AuditError

COMPARE_COLUMNS = (
    "report",
    "model",
    "data_source",
    "N",
    "n",
    "d",
    "weights",
    "representation",
    "test",
    "k",
    "statement",
    "fraction",
    "fraction_low",
    "fraction_high",
    "threshold",
    "share_meets_threshold",
    "rtol",
    "critical_rtol",
    "critical_rtol_low",
    "critical_rtol_high",
    "critical_rtol_exact",
)
COMPARE_FILES = ("compare.csv", "compare.md", "compare_kruskal.png", "compare_depth.png", "report.html")
REPORT_COLUMNS = ("report", "folder", "model", "data", "N", "n", "d", "weights", "tested", "skipped")


@dataclass(frozen=True)
class Report:
    """One report folder to compare, with the name it is shown under."""

    folder: Path
    label: str  # the model, or model (folder name) when two reports are of the same model

    @property
    def depth_csv(self) -> Path:
        return self.folder / "depth.csv"


AUDIT_COLUMNS = ("model", "representation", "weights", "test", "status")  # every audit's results.csv has them
STATUSES = ("ok", "skipped")
NUMBER_COLUMNS = ("k", "N", "n", "d", "fraction", "threshold", "rtol")  # what every compared row shows
LAB_COLUMNS = ("unit", "unit_config")  # stamped on every row of a lab sweep's results.csv


def _table_lines(path: Path, what: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and rows ``(line, cells)`` of a CSV file, refused with one line naming ``path`` when it is
    empty, not text, or truncated (a row with fewer or more cells than the header, or no newline at the end:
    the file was cut mid-row)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise AuditError(f"cannot read {str(path)!r} ({err.strerror or err})") from None
    if not data.strip():
        raise AuditError(f"{path}: empty file ({len(data)} bytes); {what} starts with a header line")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise AuditError(f"{path}: not a text file; {what} is comma-separated text") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
        rows = []
        for cells in reader:
            if cells:
                rows.append((reader.line_num, cells))
                if len(cells) != len(header):
                    raise AuditError(
                        f"{path}: line {reader.line_num} has {len(cells)} cells where the header has "
                        f"{len(header)}; the file is truncated or damaged: rerun the audit that wrote it"
                    )
    except csv.Error as err:
        raise AuditError(
            f"{path}: line {reader.line_num} is not valid CSV ({err}); the file is damaged"
        ) from None
    if not text.endswith(("\n", "\r")):
        raise AuditError(
            f"{path}: ends mid-row (no newline after its last line); the file was cut short: rerun the "
            "audit that wrote it"
        )
    return header, rows


def _bad_cell(column: str, value: str) -> str | None:
    """What is wrong with a cell of a typed column of results.csv (None: it reads)."""
    if value == "":
        return None
    if column == "status":
        return None if value in STATUSES else f"a status ({' or '.join(STATUSES)})"
    if column == "statement":
        return None if value in STATEMENTS else f"a statement ({', '.join(STATEMENTS)})"
    try:
        if column in INT_COLUMNS:
            return None if float(value).is_integer() else "an integer"
        if column in BOOL_COLUMNS or column in LEGACY_COLUMNS:
            return None if value.strip().lower() in ("true", "false") else "True or False"
        if column in FLOAT_COLUMNS:
            float(value)
        elif column == "rank_counts":
            parse_rank_counts(value)
        elif column == "witness":
            parse_witness(value)
        elif column == "rtol_grid":
            parse_rtol_grid(value)
    except (ValueError, TypeError, IndexError, OverflowError):
        return {
            "rank_counts": "a rank histogram rank:count;...",
            "witness": "space-separated example indices",
            "rtol_grid": "a tolerance grid multiplier:fraction;...",
        }.get(column, "a number")
    return None


def check_results_csv(path: str | Path) -> None:
    """Refuse, with one line naming the file, a ``results.csv`` that is not an audit's rows as written: empty,
    truncated, a lab sweep's results, other columns, or a cell its column cannot hold (a verdict that is not
    True/False, a count that is not an integer, ...)."""
    path = Path(path)
    header, rows = _table_lines(path, "an audit's results.csv")
    columns = set(header)
    if set(LAB_COLUMNS) <= columns:
        raise AuditError(
            f"{path}: the results of a lab sweep (audit memorize, facts, assoc, ...), not of an audit; "
            "compare takes folders written by 'audit MODEL'"
        )
    missing = [c for c in AUDIT_COLUMNS if c not in columns]
    if missing:
        raise AuditError(
            f"{path}: not an audit's results.csv (no column {', '.join(missing)}); compare takes folders "
            "written by 'audit MODEL'"
        )
    absent = [c for c in NUMBER_COLUMNS if c not in columns]  # compare would show these empty: refused
    if absent:
        unknown = sorted(columns - set(SCHEMA_COLUMNS) - set(LEGACY_COLUMNS))
        extra = f" and has column(s) {', '.join(unknown)} the schema no longer has" if unknown else ""
        raise AuditError(
            f"{path}: no column {', '.join(absent)}{extra} (written by another version of the auditor); "
            "rerun the audit that wrote it to compare it"
        )
    typed = [
        (i, c)
        for i, c in enumerate(header)
        if c in (*INT_COLUMNS, *BOOL_COLUMNS, *LEGACY_COLUMNS, *FLOAT_COLUMNS, "rank_counts", "witness",
                 "rtol_grid", "status", "statement")
    ]
    for line, cells in rows:
        for i, column in typed:
            wrong = _bad_cell(column, cells[i])
            if wrong:
                raise AuditError(
                    f"{path}: line {line}, column {column}: {cells[i]!r} is not {wrong}; the file is "
                    "damaged or was edited: rerun the audit that wrote it"
                )
    if not rows:
        raise AuditError(f"{path}: a header without rows; the audit that wrote it did not finish")


def check_depth_csv(path: str | Path) -> None:
    """Refuse an empty or truncated ``depth.csv`` with one line naming it (the figures read it)."""
    header, _ = _table_lines(Path(path), "an audit's depth.csv")
    if "depth" not in header:
        raise AuditError(f"{path}: not an audit's depth.csv (no column depth)")


def _report_model(folder: Path) -> str | None:
    """The model of a folder's audit rows (the first row's), None when it holds none readable."""
    try:
        with open(folder / "results.csv", newline="") as fh:
            reader = csv.DictReader(fh)
            first = next(reader, None)
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return first.get("model") if first and set(AUDIT_COLUMNS) <= set(reader.fieldnames or ()) else None


def resolve_report(reference: str | Path, root: str | Path | None = None) -> tuple[Path, str | None]:
    """The report folder a REPORT argument names, and a note when a model name picked it.

    ``reference``: a folder holding a ``results.csv``, or a model name: of the folders ``reports/*`` under
    ``root`` (default: the current directory) whose audit rows are of exactly that model (``gpt2`` never
    picks a ``gpt2-large`` report), the one whose ``results.csv`` is newest.
    """
    root = Path.cwd() if root is None else Path(root)
    path = Path(reference)
    if not path.is_absolute() and not path.exists():
        path = root / path
    if path.is_dir():
        if not (path / "results.csv").is_file():
            raise AuditError(
                f"no results.csv in {str(reference)!r}; give a folder an audit wrote its report into"
            )
        return path, None
    if path.exists():
        raise AuditError(
            f"{str(reference)!r} is a file; give the report folder that holds it (or a model name)"
        )
    name = str(reference)
    models = {
        p: _report_model(p) for p in sorted((root / "reports").glob("*")) if (p / "results.csv").is_file()
    }
    candidates = [p for p, model in models.items() if model == name]
    if not candidates:
        known = sorted({m for m in models.values() if m})
        hint = f"; models with reports there: {', '.join(known)}" if known else ""
        raise AuditError(f"no report folder or model {name!r}: no such folder, and no folder under "
                         f"{str(root / 'reports')!r} holds an audit of model {name!r}{hint}")
    newest = max(candidates, key=lambda p: ((p / "results.csv").stat().st_mtime, p.name))
    others = f", the newest of {len(candidates)}" if len(candidates) > 1 else ""
    return newest, f"{name}: using {newest} (its audit of model {name!r}{others})"


def compare_table(reports: Sequence[Report]) -> pd.DataFrame:
    """One row per report x weights x representation x test that was tested (columns
    :data:`COMPARE_COLUMNS`); skipped rows are folded into :func:`report_table`."""
    records = []
    for report in reports:
        rows = read_rows(report.folder / "results.csv")
        for row in rows[rows["status"] == "ok"].to_dict("records"):
            records.append({key: row.get(key) for key in COMPARE_COLUMNS if key != "report"}
                           | {"report": str(report.folder)})
    table = pd.DataFrame(records, columns=list(COMPARE_COLUMNS))
    for key in ("fraction", "fraction_low", "fraction_high", "threshold", "rtol", "critical_rtol",
                "critical_rtol_low", "critical_rtol_high"):
        table[key] = pd.to_numeric(table[key], errors="coerce").astype(float)
    for key in ("N", "n", "d", "k"):
        table[key] = pd.array([None if v is None or pd.isna(v) else int(v) for v in table[key]],
                              dtype="Int64")
    for key in ("share_meets_threshold", "critical_rtol_exact"):
        table[key] = pd.array([None if v is None or pd.isna(v) else bool(v) for v in table[key]],
                              dtype="boolean")
    return table


def report_table(reports: Sequence[Report]) -> pd.DataFrame:
    """One row per report (columns :data:`REPORT_COLUMNS`): what it measured (model, data as given, N, n,
    d, the weights sources tested, how many rows) and its skipped rows folded into one cell (``12 rows of
    pretrained: weights unavailable``)."""
    from auditor.audit.report.tables import skipped_text

    records = []
    for report in reports:
        rows = read_rows(report.folder / "results.csv")
        ok, skipped = rows[rows["status"] == "ok"], rows[rows["status"] != "ok"]
        first = ok.iloc[0] if not ok.empty else rows.iloc[0]

        def values(key: str, frame: pd.DataFrame = ok) -> str:
            found = [str(int(v)) if isinstance(v, int | float) and float(v).is_integer() else str(v)
                     for v in dict.fromkeys(frame[key].dropna())] if key in frame else []
            return ", ".join(found)

        folded = []
        for weights, part in skipped.groupby("weights", sort=False):
            reasons = sorted({skipped_text(r).removeprefix("skipped: ") for r in part.to_dict("records")})
            folded.append(f"{len(part)} rows of {weights}: {', '.join(reasons)}")
        records.append({
            "report": report.label, "folder": str(report.folder), "model": first.get("model"),
            "data": first.get("data_source"), "N": values("N"), "n": values("n"), "d": values("d"),
            "weights": values("weights"), "tested": len(ok), "skipped": "; ".join(folded),
        })
    return pd.DataFrame(records, columns=list(REPORT_COLUMNS))


def markdown_table(table: pd.DataFrame, labels: dict[str, str] | None = None) -> str:
    """The rows for people: the statement first, then the fraction with its interval and its threshold, the
    critical rtol as a multiple of rtol; ``labels``: report folder -> the name it is shown under."""
    labels = labels or {}
    records = table.to_dict("records")
    shown = pd.DataFrame(
        {
            "report": [labels.get(str(r), str(r)) for r in table["report"]],
            "weights": table["weights"],
            "representation": table["representation"],
            "test": table["test"],
            "k": [_int(v) for v in table["k"]],
            "statement": [r["statement"] if isinstance(r["statement"], str) else "" for r in records],
            "fraction [95% interval]": [_fraction_cell(r) for r in records],
            "threshold": [
                "" if pd.isna(r["threshold"]) else f"{r['threshold']:g}" + (
                    "" if pd.isna(r["share_meets_threshold"])
                    else " met" if r["share_meets_threshold"] else " not met")
                for r in records
            ],
            "rtol": [_g(v) for v in table["rtol"]],
            "critical rtol / rtol": [_critical_cell(r) for r in records],
        }
    )
    return shown.to_markdown(index=False, disable_numparse=True)


def reports_markdown(reports_frame: pd.DataFrame) -> str:
    """The "Reports" table for people: what each report measured, and what it skipped."""
    shown = reports_frame.drop(columns=["folder"]).rename(columns={"tested": "rows tested",
                                                                  "skipped": "rows skipped"})
    shown["rows skipped"] = [s or "none" for s in shown["rows skipped"]]
    return shown.to_markdown(index=False, disable_numparse=True)


def _int(value) -> str:
    return "" if value is None or pd.isna(value) else str(int(value))


def compare(
    references: Sequence[str | Path],
    out: str | Path | None = None,
    *,
    root: str | Path | None = None,
    plots: bool = True,
    echo=None,
) -> pd.DataFrame:
    """Compare the reports named by ``references`` (folders or model names); write the table and figures
    into ``out`` (default ``reports/compare-<timestamp>`` under ``root``) and return the table
    (:func:`compare_table`; the text of compare.md in its ``attrs["markdown"]``).

    ``echo``: called with each note (which folder a model name picked, where the files went).
    """
    if not references:
        raise AuditError("give at least one report folder or model name to compare")
    root = Path.cwd() if root is None else Path(root)
    out = Path(out) if out is not None else root / "reports" / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    check_output_folder(out, COMPARE_FILES, "audit compare")
    folders = []
    for reference in references:  # every input checked before any work
        folder, note = resolve_report(reference, root)
        check_results_csv(folder / "results.csv")
        if (folder / "depth.csv").is_file():
            check_depth_csv(folder / "depth.csv")
        if note and echo:
            echo(note)
        folders.append(folder)
    reports = _labelled(folders)
    table = compare_table(reports)
    described = report_table(reports)
    try:
        real_folder(out)
    except OSError as err:
        raise AuditError(
            f"cannot write to output folder {str(out)!r} ({err.strerror}); choose another --out"
        ) from None
    with confined(out), Staged() as staged:
        staged.text(out / "compare.csv", table.to_csv(index=False))
        table.attrs["markdown"] = compare_markdown(table, described, reports)
        staged.text(out / "compare.md", table.attrs["markdown"])
        staged.text(out / "report.html", compare_html(table, reports, out, figures=plots))  # all on one page
        if plots:
            _stage_figures(table, reports, out, staged)
        staged.commit()
    if echo:
        echo(f"wrote {out}")
    return table


def compare_markdown(table: pd.DataFrame, described: pd.DataFrame, reports: Sequence[Report]) -> str:
    """The text of compare.md: what each report measured, then the tested rows."""
    labels = {str(r.folder): r.label for r in reports}
    return "\n".join([
        "# Comparison of audit reports", "",
        "## Reports", "",
        "\n".join(f"- {r.label}: `{r.folder}`" for r in reports), "",
        reports_markdown(described), "",
        "## Tested rows", "",
        "Statement: the strict statement at the row's rtol (Kruskal rank >= k; for Assumption 2, every "
        "context of rank n): refuted by a witness, proven by a certified bound (or every subset enumerated), "
        "or not decided. The fraction is the share of full-rank sampled k-subsets (rank-n contexts) with its "
        "95% interval; the threshold is what that share is compared with, never a proof of the statement.",
        "",
        markdown_table(table, labels), "",
    ])


def _stage_figures(table: pd.DataFrame, reports: Sequence[Report], out: Path, staged: Staged) -> None:
    import matplotlib.pyplot as plt  # only when drawing: `audit compare --no-plots` stays light

    from auditor.audit.report.compare_plots import depth_overlay, kruskal_by_test
    from auditor.audit.report.depth import read_depth
    from auditor.audit.report.style import DPI, figure_style

    labels = {str(r.folder): r.label for r in reports}
    drawings = []
    if table["fraction"].notna().any():
        drawings.append(("compare_kruskal.png", lambda: kruskal_by_test(table, labels)))
    depths = {r.label: read_depth(r.depth_csv) for r in reports if r.depth_csv.is_file()}
    depths = {label: frame for label, frame in depths.items() if not frame.empty and "depth" in frame.columns}
    if depths:
        drawings.append(("compare_depth.png", lambda: depth_overlay(depths)))
    for name, draw in drawings:
        with figure_style():
            fig = draw()
        try:
            staged.write(out / name, lambda tmp, fig=fig: fig.savefig(tmp, dpi=DPI, format="png"))
            staged.write(
                (out / name).with_suffix(".pdf"), lambda tmp, fig=fig: fig.savefig(tmp, format="pdf")
            )
        finally:
            plt.close(fig)


def _labelled(folders: Sequence[Path]) -> list[Report]:
    """Each folder with its model's name, or ``model (folder)`` when a model appears twice."""
    models = []
    for folder in folders:
        rows = pd.read_csv(folder / "results.csv", usecols=lambda c: c == "model", nrows=1)
        models.append(str(rows["model"].iloc[0]) if "model" in rows and len(rows) else folder.name)
    return [Report(folder, model if models.count(model) == 1 else f"{model} ({folder.name})")
            for folder, model in zip(folders, models, strict=True)]


def _fraction_cell(row: dict) -> str:
    if pd.isna(row["fraction"]):
        return ""
    text = f"{row['fraction']:.4f}"
    if not (pd.isna(row["fraction_low"]) or pd.isna(row["fraction_high"])):
        text += f" [{row['fraction_low']:.4f}, {row['fraction_high']:.4f}]"
    return text


def _critical_cell(row: dict) -> str:
    """The critical tolerance as a multiple of rtol, quoted as it was proven (see
    :func:`auditor.audit.report.tables.critical_cell`)."""
    from auditor.audit.report.tables import critical_cell

    return critical_cell(pd.Series(row))


def _g(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.3g}"


@click.command("compare", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.argument("reports", nargs=-1, required=True, metavar="REPORT...")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for compare.csv, compare.md and the figures (default: reports/compare-<timestamp>).",
)
@click.option("--plots/--no-plots", default=True, show_default=True, help="Draw the overlay figures.")
def compare_command(reports: tuple[str, ...], out: str | None, plots: bool) -> None:
    """Put audit reports side by side: what each measured (model, data, N, n, d, weights, skipped rows),
    one table of statements, fractions against their thresholds and critical rtol, and overlay figures.

    Each REPORT is a report folder (with the results.csv an audit wrote) or a model name, meaning the folder
    under reports/ (in the current directory) with the newest audit of exactly that model.

    \b
    Example:  audit compare minilm reports/vit-base-imagenet1000 --out reports/compare-minilm-vit
    """
    table = compare(reports, out, plots=plots, echo=lambda msg: click.echo(msg, err=True))
    click.echo(table.attrs["markdown"].split("\n", 2)[2])  # compare.md without its title
