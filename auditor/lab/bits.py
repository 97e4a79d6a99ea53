"""Bits per parameter: every room's capacity in one unit (``audit bits``).

Each room stores something different, so each room reads its own results: its
:class:`~auditor.lab.room.BitsReader` (declared in the room's package, e.g. :mod:`auditor.lab.memorize.bits`)
claims the result CSVs it wrote and turns them into rows

    room, experiment, config, stored_bits, entropy_bits, residual_bits, parameters, bits_per_parameter,
    formula, converged, source

with the formula written out on every row. Every reader counts with the one definition of
:mod:`auditor.lab.information`, as the published capacities are counted (Allen-Zhu and Li; Morris et
al.): ``stored_bits`` = ``entropy_bits`` (H, the entropy of the data's generator, from the task's own
parameters) - ``residual_bits`` (L, the model's log-loss in bits, or the code correcting its argmax errors),
clipped to [0, H]. A model at chance stores 0, and no row exceeds the entropy of its data. This module
finds the CSVs, asks every room's reader (exactly one may claim a CSV; a CSV no room claims holds nothing
to count), checks the counts and draws them.

``converged`` is True when the count comes from a run that finished (all memorized, a plateau, an early
stop at full accuracy, or no training at all), False when it stopped at its step limit, empty when the CSV
cannot tell. ``audit bits [REPORT_DIRS...]`` finds the result CSVs under the folders, writes ``bits.csv``
and ``bits.png`` (bits per parameter against parameters, with 2 bits/param (Allen-Zhu and Li, 2024),
3.6 and 3.5 bits/param (Morris et al., 2025, float32 and bfloat16) and, for the attention layers of paper
A, the bounds H(n-1)+1 and H d_h + d in the same unit). The plot draws the three convergence classes apart
(filled: converged; faint hollow triangle: step-limited; hollow diamond: convergence not recorded) and the
printed summary's headline median, min and max use the converged rows only; its "(all rows)" columns say
so when they count the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd

from auditor.core.atomic import check_output_folder, confined, real_folder
from auditor.core.errors import AuditError
from auditor.lab.stats import is_true

OUT_FILES = ("bits.csv", "bits.png")  # what `audit bits` writes into --out
DEFAULT_DIRS = ("reports/memorize", "reports/facts", "reports/assoc", "reports/lm/reference")
COLUMNS = (
    "room",
    "experiment",
    "config",
    "stored_bits",
    "entropy_bits",
    "residual_bits",
    "parameters",
    "bits_per_parameter",
    "formula",
    "converged",
    "source",
    "bound_bits_paper_a",
    "bound_bits_dana",
)
REFERENCES = {"2 bits/param (Allen-Zhu and Li 2024)": 2.0,
              "3.6 bits/param (Morris et al. 2025, float32)": 3.6,
              "3.5 bits/param (Morris et al. 2025, bfloat16)": 3.5}


def unknown_convergence(frame: pd.DataFrame) -> pd.Series:
    """``converged`` of rows whose CSV cannot tell: empty (None), never a guess."""
    return pd.Series([None] * len(frame), index=frame.index, dtype=object)


def convergence_flags(column: pd.Series) -> pd.Series:
    """A recorded ``converged`` column as True/False, an empty cell as None (unknown, not True)."""
    return column.map(lambda v: None if pd.isna(v) else is_true(v)).astype(object)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _check_counts(rows: pd.DataFrame, file: Path, room: str) -> None:
    """Refuse a CSV whose rows cannot be counted: stored bits must be finite and >= 0, parameters finite and
    > 0 (a foreign CSV with negative counts, a class count of 0 or no parameters would give negative or
    infinite bits per parameter). Names the file and the first bad row (its line in the file)."""
    bits = pd.to_numeric(rows["stored_bits"], errors="coerce").astype(float)
    params = pd.to_numeric(rows["parameters"], errors="coerce").astype(float)
    entropy = pd.to_numeric(rows["entropy_bits"], errors="coerce").astype(float)
    checks = (
        (~np.isfinite(bits), "stored bits {} (from its counts) are not a finite number"),
        (bits > entropy * (1 + 1e-12), "stored bits {} exceed the entropy of its data"),
        (bits < 0, "stored bits {} are negative (a negative count, or fewer than 1 class, value or answer)"),
        (~np.isfinite(params), "its parameters {} are not a finite number"),
        (params <= 0, "its parameters {} are not positive"),
    )
    for bad, what in checks:
        if bad.any():
            index = bad[bad].index[0]
            value = params[index] if "parameters" in what else bits[index]
            line = index + 2 if isinstance(index, int | np.integer) else index
            raise AuditError(f"{file}: line {line} cannot be counted ({room} room): "
                             + what.format(f"{value:g}") + f"; {bad.sum()} of {len(rows)} rows are like it")


def bits_table(paths: Sequence[str | Path], root: str | Path | None = None) -> pd.DataFrame:
    """The rows of every result CSV found at or under ``paths`` that a room can count (others skipped)."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise AuditError(f"report folder {str(path)!r} does not exist; give folders holding result CSVs "
                             "(e.g. reports/memorize reports/facts reports/assoc)")
        files += [path] if path.is_file() else sorted(path.rglob("*.csv"))
    from auditor.lab.room import bits_readers

    readers = bits_readers()
    frames = []
    for file in files:
        try:
            head = pd.read_csv(file, nrows=0)
        except (ValueError, UnicodeDecodeError) as err:  # empty, binary or malformed: name the file, one line
            raise AuditError(f"{file}: not a readable result CSV ({_first_line(err)})") from None
        columns = set(head.columns)
        claimed = [name for name, reader in readers.items() if reader.claims(columns)]
        if len(claimed) > 1:
            raise AuditError(
                f"{file}: the rooms {', '.join(claimed)} each claim this result CSV; its columns "
                f"do not tell which room wrote it"
            )
        if not claimed:
            continue
        room = claimed[0]
        try:
            rows = readers[room].read(pd.read_csv(file), file)
        except KeyError as err:
            missing = err.args[0] if err.args else "?"
            raise AuditError(
                f"{file}: a {room} result CSV without the column {missing}; "
                f"columns: {', '.join(map(str, head.columns))}"
            ) from None
        except (ValueError, TypeError, UnicodeDecodeError) as err:
            raise AuditError(
                f"{file}: cannot count the bits of this {room} result CSV ({_first_line(err)})"
            ) from None
        _check_counts(rows, file, room)
        source = file.relative_to(root) if root and file.is_relative_to(root) else file
        frames.append(rows.assign(source=str(source)))
    if not frames:
        raise AuditError("no result CSV with stored facts or memorized examples found under "
                         + ", ".join(map(str, paths)))
    out = pd.concat(frames, ignore_index=True)
    out["bits_per_parameter"] = out["stored_bits"] / out["parameters"]
    for column in COLUMNS:
        if column not in out:
            out[column] = None
    return out[list(COLUMNS)]


CONVERGED, STEP_LIMITED, NOT_RECORDED = "converged", "step-limited", "convergence not recorded"
# how each class is drawn in bits.png: filled, hollow and faint, hollow in another shape
_STYLE = {CONVERGED: {"marker": "o", "alpha": 1.0, "filled": True},
          STEP_LIMITED: {"marker": "v", "alpha": 0.35, "filled": False},
          NOT_RECORDED: {"marker": "D", "alpha": 0.9, "filled": False}}
_KEY = {CONVERGED: "converged (filled): the headline medians and ranges use only these",
        STEP_LIMITED: "step-limited, not converged (faint hollow triangle): excluded from medians and ranges",
        NOT_RECORDED: "convergence not recorded (hollow diamond): excluded from medians and ranges"}


def convergence_class(value: object) -> str:
    """CONVERGED for True, STEP_LIMITED for False, NOT_RECORDED for an empty cell (None, NaN, '')."""
    empty = value is None or (pd.api.types.is_scalar(value) and pd.isna(value))
    if empty or str(value).strip().lower() in ("", "nan", "none"):
        return NOT_RECORDED
    return CONVERGED if is_true(value) else STEP_LIMITED


def bits_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per room and experiment: row counts per convergence class; median, min and max bits per parameter over
    the converged rows only (the headline numbers, empty where no row converged); median and max over all
    rows (step-limited rows and rows whose convergence is not recorded included), named as such."""
    classes = table["converged"].map(convergence_class)
    out = []
    for (room, experiment), part in table.groupby(["room", "experiment"], sort=True):
        kind = classes.loc[part.index]
        bpp = pd.to_numeric(part["bits_per_parameter"], errors="coerce")
        done = bpp[kind == CONVERGED]
        out.append(
            {
                "room": room,
                "experiment": experiment,
                "rows": len(part),
                "converged": int((kind == CONVERGED).sum()),
                "step-limited": int((kind == STEP_LIMITED).sum()),
                "not recorded": int((kind == NOT_RECORDED).sum()),
                "median (converged)": done.median(),
                "min (converged)": done.min(),
                "max (converged)": done.max(),
                "median (all rows)": bpp.median(),
                "max (all rows)": bpp.max(),
            }
        )
    return pd.DataFrame(out)


def draw_bits(table: pd.DataFrame, ax: Any) -> Any:
    """Bits per parameter against parameters on ``ax``, one color per room and experiment, one marker per
    convergence class (filled: converged; faint hollow triangle: step-limited; hollow diamond: convergence not
    recorded), with the reference lines and the paper-A bounds at the same configurations (small hollow
    circle: H(n-1)+1, plus: H d_h + d). Every artist that stands for a class is labelled in the legend."""
    from auditor.lab.figures import plt

    groups = list(table.groupby(["room", "experiment"], sort=True))
    # one color per group, as many as there are groups (zip would drop the groups past the palette)
    colors = plt.cm.tab20(np.arange(len(groups)) % 20)
    classes = table["converged"].map(convergence_class)
    bpp_all = pd.to_numeric(table["bits_per_parameter"], errors="coerce")
    positive = bpp_all[bpp_all > 0]
    floor = float(positive.min()) / 3 if len(positive) else 1e-3  # where rows storing 0 bits are drawn
    for color, ((room, experiment), part) in zip(colors, groups):
        kind = classes.loc[part.index]
        bpp = pd.to_numeric(part["bits_per_parameter"], errors="coerce")
        counts = [f"{int((kind == c).sum())} {name}" for c, name in ((CONVERGED, "converged"),
                                                                      (STEP_LIMITED, "step-limited"),
                                                                      (NOT_RECORDED, "not recorded"))
                  if (kind == c).any()]
        zero = int((bpp == 0).sum())
        counts += [f"{zero} store 0"] if zero else []
        ax.plot(
            [], [], color=color, lw=5, label=f"{room}: {experiment} ({len(part)} rows: {', '.join(counts)})"
        )
        for name, style in _STYLE.items():
            rows = part[(kind == name) & (bpp > 0)]
            if len(rows):
                ax.scatter(rows["parameters"], rows["bits_per_parameter"], s=16, marker=style["marker"],
                           color=color, facecolors=color if style["filled"] else "none", alpha=style["alpha"],
                           lw=0.8, gid=name)
        if zero:
            ax.scatter(part.loc[bpp == 0, "parameters"], np.full(zero, floor), s=14, marker="x", color=color,
                       lw=0.8, alpha=0.6, gid="zero")
        for column, marker in (("bound_bits_paper_a", "o"), ("bound_bits_dana", "+")):
            bound = pd.to_numeric(part[column], errors="coerce")
            if bound.notna().any():
                ax.scatter(part["parameters"], bound / part["parameters"], s=9, marker=marker, color=color,
                           facecolors="none" if marker == "o" else color, lw=0.5, alpha=0.5, gid="bound")
    for name, style in _STYLE.items():
        ax.scatter(
            [],
            [],
            s=16,
            marker=style["marker"],
            color="k",
            facecolors="k" if style["filled"] else "none",
            alpha=max(style["alpha"], 0.5),
            lw=0.8,
            label=_KEY[name],
        )
    if (bpp_all == 0).any():
        ax.axhline(floor, color="k", lw=0.4, alpha=0.4)
        ax.scatter([], [], s=14, marker="x", color="k", lw=0.8,
                   label="stores 0 bits (no better than chance): drawn on the bottom line")
    ax.scatter([], [], s=9, marker="o", facecolors="none", color="k", lw=0.5,
               label="paper A: H(n-1)+1 examples, same unit (small hollow circle)")
    ax.scatter([], [], s=9, marker="+", color="k", lw=0.5, label="Dana et al.: H d_h + d examples, same unit")
    for label, value in REFERENCES.items():
        ax.axhline(value, color="gray", ls={2.0: "--", 3.6: ":"}.get(value, "-."), lw=1, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("trainable parameters")
    ax.set_ylabel("bits_per_parameter ((H - L)+ / parameters)")
    return ax


def plot_bits(table: pd.DataFrame, path: str | Path) -> Path:
    """``draw_bits`` saved as a PNG, the legend beside the axes."""
    from auditor.lab.figures import plt, save

    fig, ax = plt.subplots(figsize=(11.5, 5.6))
    draw_bits(table, ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return save(fig, path,
                title="stored bits per parameter, every room: the data's entropy less the residual code")


@click.command("bits", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("report_dirs", nargs=-1)
@click.option("--out", default="reports/bits", show_default=True, help="Folder for bits.csv and bits.png.")
@click.option("--plots/--no-plots", default=True, show_default=True, help="Draw bits.png.")
def bits_command(report_dirs: tuple[str, ...], out: str, plots: bool) -> None:
    """Stored bits per trainable parameter of every room's results (memorize, certify, capacity, facts,
    recall, assoc, lm): the data's entropy less the model's residual code, clipped at 0, with each row's
    formula; REPORT_DIRS default to reports/memorize reports/facts reports/assoc reports/lm/reference."""
    from auditor.lab.sweep import write_table

    dirs = report_dirs or tuple(d for d in DEFAULT_DIRS if d != "reports/lm/reference" or Path(d).exists())
    folder = Path(out)
    check_output_folder(folder, OUT_FILES, "audit bits")
    table = bits_table(dirs, root=Path.cwd())
    try:
        with confined(folder):
            real_folder(folder)
            write_table(table, folder / "bits.csv", device="cpu", seed="")
            if plots:
                plot_bits(table, folder / "bits.png")
    except OSError as err:
        raise AuditError(f"cannot write into {str(folder)!r}: {err.strerror or err} "
                         f"({err.filename or folder}); choose another --out") from None
    summary = bits_summary(table)
    summary = summary.astype(object).where(summary.notna(), None)  # no converged row: an empty cell, not nan
    click.echo(summary.to_markdown(index=False, floatfmt=".3g", missingval=""))
    click.echo(
        "\nmedian, min and max (converged): over the converged rows only (empty where none converged); "
        "(all rows): step-limited rows and rows whose convergence is not recorded included."
    )
    unknown = table.loc[table["converged"].isna(), "source"].value_counts(sort=False)
    if len(unknown):
        click.echo(
            "\nconvergence not recorded (convergence unknown, empty `converged`: the CSV records neither a "
            "convergence flag nor a step budget to compare with): "
            + "; ".join(f"{source} ({n} rows)" for source, n in unknown.items())
        )
    click.echo(
        f"\nbits per parameter: {folder / 'bits.csv'}" + (f"; plot: {folder / 'bits.png'}" if plots else "")
    )
