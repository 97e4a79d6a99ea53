"""``audit compare REPORT...``: the verdicts of several audit reports side by side.

A REPORT is a report folder (holding the ``results.csv`` an audit wrote, maybe a ``depth.csv``) or a model
name, which stands for the newest ``reports/<name>-*`` folder holding a ``results.csv`` under the current
directory. The comparison is one table (``compare.csv``, ``compare.md``, also printed): one row per model,
weights, representation and test with the fraction and its 95% interval, the verdict and the critical rtol
(the tolerance at which the verdict flips), and overlay figures: the Kruskal fractions by test across the
reports (``compare_kruskal.png``) and, where reports have a ``depth.csv``, their depth profiles overlaid
(``compare_depth.png``). Reports written before a column existed still compare: its cells stay empty.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import pandas as pd

from auditor.assumptions import KRUSKAL_TESTS
from auditor.atomic import Staged
from auditor.errors import AuditError
from auditor.report.schema import read_rows

COMPARE_COLUMNS = ("report", "model", "weights", "representation", "test", "fraction", "fraction_low",
                   "fraction_high", "verdict", "rtol", "critical_rtol")
COMPARE_FILES = ("compare.csv", "compare.md", "compare_kruskal.png", "compare_depth.png")


@dataclass(frozen=True)
class Report:
    """One report folder to compare, with the name it is shown under."""

    folder: Path
    label: str  # the model, or model (folder name) when two reports are of the same model

    @property
    def depth_csv(self) -> Path:
        return self.folder / "depth.csv"


def resolve_report(reference: str | Path, root: str | Path | None = None) -> tuple[Path, str | None]:
    """The report folder a REPORT argument names, and a note when a model name picked it.

    ``reference``: a folder holding a ``results.csv``, or a model name: the newest ``reports/<name>-*`` folder
    under ``root`` (default: the current directory) that holds a ``results.csv`` (newest by that file's time).
    """
    root = Path.cwd() if root is None else Path(root)
    path = Path(reference)
    if not path.is_absolute() and not path.exists():
        path = root / path
    if path.is_dir():
        if not (path / "results.csv").is_file():
            raise AuditError(f"no results.csv in {str(reference)!r}; give a folder an audit wrote its report into")
        return path, None
    name = str(reference)
    candidates = [p for p in (root / "reports").glob(f"{name}-*") if (p / "results.csv").is_file()] \
        if "/" not in name else []
    if not candidates:
        known = sorted({p.parent.name.split("-")[0] for p in (root / "reports").glob("*/results.csv")})
        hint = f"; models with reports here: {', '.join(known)}" if known else ""
        raise AuditError(f"no report folder or model {name!r}: no such folder and no reports/{name}-* folder with "
                         f"a results.csv under {str(root)!r}{hint}")
    newest = max(candidates, key=lambda p: ((p / "results.csv").stat().st_mtime, p.name))
    return newest, f"{name}: using {newest} (the newest reports/{name}-* holding a results.csv)"


def compare_table(reports: Sequence[Report]) -> pd.DataFrame:
    """One row per report x weights x representation x test (columns :data:`COMPARE_COLUMNS`)."""
    records = []
    for report in reports:
        rows = read_rows(report.folder / "results.csv")
        for row in rows.to_dict("records"):
            ok = row.get("status") == "ok"
            holds = row.get("holds")
            records.append({
                "report": str(report.folder), "model": row.get("model"), "weights": row.get("weights"),
                "representation": row.get("representation"), "test": row.get("test"),
                "fraction": row.get("fraction") if ok else None,
                "fraction_low": row.get("fraction_low") if ok else None,
                "fraction_high": row.get("fraction_high") if ok else None,
                "verdict": ("holds" if holds else "fails") if ok and not pd.isna(holds) else "skipped",
                "rtol": row.get("rtol"), "critical_rtol": row.get("critical_rtol") if ok else None,
            })
    table = pd.DataFrame(records, columns=list(COMPARE_COLUMNS))
    for key in ("fraction", "fraction_low", "fraction_high", "rtol", "critical_rtol"):
        table[key] = pd.to_numeric(table[key], errors="coerce").astype(float)
    return table


def markdown_table(table: pd.DataFrame) -> str:
    """The table for people: the fraction with its interval in one cell, numbers rounded."""
    shown = pd.DataFrame({
        "model": table["model"], "weights": table["weights"], "representation": table["representation"],
        "test": table["test"], "fraction [95% interval]": [_fraction_cell(r) for r in table.to_dict("records")],
        "verdict": table["verdict"], "rtol": [_g(v) for v in table["rtol"]],
        "critical rtol": [_g(v) for v in table["critical_rtol"]],
    })
    return shown.to_markdown(index=False, disable_numparse=True)


def compare(references: Sequence[str | Path], out: str | Path | None = None, *, root: str | Path | None = None,
            plots: bool = True, echo=None) -> pd.DataFrame:
    """Compare the reports named by ``references`` (folders or model names); write the table and figures
    into ``out`` (default ``reports/compare-<timestamp>`` under ``root``) and return the table.

    ``echo``: called with each note (which folder a model name picked, where the files went).
    """
    if not references:
        raise AuditError("give at least one report folder or model name to compare")
    root = Path.cwd() if root is None else Path(root)
    folders = []
    for reference in references:
        folder, note = resolve_report(reference, root)
        if note and echo:
            echo(note)
        folders.append(folder)
    reports = _labelled(folders)
    table = compare_table(reports)
    out = Path(out) if out is not None else root / "reports" / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AuditError(f"cannot write to output folder {str(out)!r} ({err.strerror}); choose another --out") \
            from None
    with Staged() as staged:
        staged.text(out / "compare.csv", table.to_csv(index=False))
        staged.text(out / "compare.md", "# Comparison of audit reports\n\n" + "\n".join(
            f"- {r.label}: `{r.folder}`" for r in reports) + "\n\n" + markdown_table(table) + "\n")
        if plots:
            _stage_figures(table, reports, out, staged)
        staged.commit()
    if echo:
        echo(f"wrote {out}")
    return table


def _stage_figures(table: pd.DataFrame, reports: Sequence[Report], out: Path, staged: Staged) -> None:
    import matplotlib.pyplot as plt  # only when drawing: `audit compare --no-plots` stays light

    from auditor.report.compare_plots import depth_overlay, kruskal_by_test
    from auditor.report.style import DPI, figure_style

    labels = {str(r.folder): r.label for r in reports}
    drawings = []
    if table["test"].isin(KRUSKAL_TESTS).any() and table["fraction"].notna().any():
        drawings.append(("compare_kruskal.png", lambda: kruskal_by_test(table, labels)))
    depths = {r.label: pd.read_csv(r.depth_csv) for r in reports if r.depth_csv.is_file()}
    depths = {label: frame for label, frame in depths.items() if not frame.empty and "depth" in frame.columns}
    if depths:
        drawings.append(("compare_depth.png", lambda: depth_overlay(depths)))
    for name, draw in drawings:
        with figure_style():
            fig = draw()
        try:
            staged.write(out / name, lambda tmp, fig=fig: fig.savefig(tmp, dpi=DPI, format="png"))
            staged.write((out / name).with_suffix(".pdf"), lambda tmp, fig=fig: fig.savefig(tmp, format="pdf"))
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


def _g(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.3g}"


@click.command("compare", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.argument("reports", nargs=-1, required=True, metavar="REPORT...")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder for compare.csv, compare.md and the figures (default: reports/compare-<timestamp>).")
@click.option("--plots/--no-plots", default=True, show_default=True, help="Draw the overlay figures.")
def compare_command(reports: tuple[str, ...], out: str | None, plots: bool) -> None:
    """Put audit reports side by side: one table of fractions, verdicts and critical rtol, and overlay
    figures.

    Each REPORT is a report folder (with the results.csv an audit wrote) or a model name, meaning the newest
    reports/<name>-* folder holding a results.csv under the current directory.

    \b
    Example:  audit compare minilm reports/vit-base-imagenet1000 --out reports/compare-minilm-vit
    """
    table = compare(reports, out, plots=plots, echo=lambda msg: click.echo(msg, err=True))
    click.echo(markdown_table(table))
