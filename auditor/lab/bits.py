"""Bits per parameter: every room's capacity in one unit.

Each room stores something different; this module turns each room's result CSV into rows

    room, experiment, config, stored_bits, parameters, bits_per_parameter, formula, converged, source

with the formula written out on every row:

* memorize (paper A), classification: memorized x log2(classes); regression: memorized x outputs x
  log2(1 / (2 error_tolerance)) (a label known to +- error_tolerance in [0, 1) is one of that many bins);
* capacity (paper A on real tokens): memorized x log2(classes);
* certify (paper A without training): guaranteed x REAL_BITS: ``guaranteed`` arbitrary real labels are
  fitted exactly, counted at float32 precision (24 significant bits, the layer's dtype);
* facts (paper B): facts_stored x log2(values);
* recall (paper C): facts x log2(D) (``recall scaling``), fact_recall x facts x log2(D) (``recall tradeoff``);
  assoc (paper C's associative memories, f(x) = x over N outputs): capacity x log2(capacity).

``converged`` is True when the count comes from a run that finished (all memorized, a plateau, an early
stop at full accuracy, or no training at all), False when it stopped at its step limit, empty when the CSV
cannot tell. ``audit bits [REPORT_DIRS...]`` finds the result CSVs under the folders, writes ``bits.csv``
and ``bits.png`` (bits per parameter against parameters, with 2 bits/param (Allen-Zhu and Li, 2024),
3.6 bits/param (Morris et al., 2025) and, for the attention layers of paper A, the bounds H(n-1)+1 and
H d_h + d in the same unit). The plot draws the three convergence classes apart (filled: converged; faint
hollow triangle: step-limited; hollow diamond: convergence not recorded) and the printed summary's headline
median, min and max use the converged rows only; its "(all rows)" columns say so when they count the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd

from auditor.core.atomic import check_output_folder, confined, real_folder
from auditor.core.errors import AuditError
from auditor.lab.stats import is_true

OUT_FILES = ("bits.csv", "bits.png")  # what `audit bits` writes into --out
REAL_BITS = 24  # significand bits of float32: the precision a certified real label is counted at
COLUMNS = ("room", "experiment", "config", "stored_bits", "parameters", "bits_per_parameter", "formula", "converged",
           "source", "bound_bits_paper_a", "bound_bits_dana")
REFERENCES = {"2 bits/param (Allen-Zhu and Li 2024)": 2.0, "3.6 bits/param (Morris et al. 2025)": 3.6}


def _layer_parameters(row: pd.Series, d_v: int | None = None, outputs: int | None = None) -> int:
    """Parameters of paper A's layer (spec variant): H(2 d d_h + d d_v) + H d_v d + d d_o."""
    from auditor.lab.memorize.model import MHAConfig

    return MHAConfig(heads=int(row["heads"]), d=int(row["d"]), d_h=int(row["d_h"]),
                     d_v=int(d_v if d_v is not None else row.get("d_v", row["d_h"])),
                     outputs=int(outputs if outputs is not None else row["classes"])).num_parameters


def _unknown(frame: pd.DataFrame) -> pd.Series:
    """``converged`` of rows whose CSV cannot tell: empty (None), never a guess."""
    return pd.Series([None] * len(frame), index=frame.index, dtype=object)


def _flags(column: pd.Series) -> pd.Series:
    """A recorded ``converged`` column as True/False, an empty cell as None (unknown, not True)."""
    return column.map(lambda v: None if pd.isna(v) else is_true(v)).astype(object)


def _attention_converged(frame: pd.DataFrame) -> pd.Series:
    """The ``converged`` column, or for older CSVs: all memorized or stopped early (steps_trained < steps)."""
    if "converged" in frame:
        return _flags(frame["converged"])
    if {"steps_trained", "steps"} <= set(frame):
        return (frame["memorized"] >= frame["N"]) | (frame["steps_trained"] < frame["steps"])
    return _unknown(frame)


def _paper_a_bounds(frame: pd.DataFrame, label_bits: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Bits of H(n-1)+1 (Proposition 2's ceiling; Theorem 1 at d_h >= n) and of H d_h + d (Dana et al.) examples."""
    return ((frame["heads"] * (frame["context"] - 1) + 1) * label_bits,
            (frame["heads"] * frame["d_h"] + frame["d"]) * label_bits)


def memorize_bits(frame: pd.DataFrame, experiment: str = "memorize") -> pd.DataFrame:
    """Rows of ``audit memorize`` (and ``audit capacity``: same columns for what is counted)."""
    regression = frame["task"].eq("regression") if "task" in frame else pd.Series(False, index=frame.index)
    tolerance = frame["error_tolerance"].astype(float) if "error_tolerance" in frame else pd.Series(np.nan, index=frame.index)
    outputs = frame["outputs"] if "outputs" in frame else pd.Series(1, index=frame.index)
    label_bits = np.where(regression, outputs * np.log2(1.0 / (2.0 * tolerance.where(regression, 0.25))),
                          np.log2(frame["classes"].astype(float)))
    label_bits = pd.Series(label_bits, index=frame.index)
    parameters = frame["parameters"] if "parameters" in frame else frame.apply(
        lambda r: _layer_parameters(r, d_v=int(r["d"]) if "d_v" not in r else None), axis=1)
    formula = np.where(regression, "memorized x outputs x log2(1 / (2 error_tolerance))", "memorized x log2(classes)")
    config = frame.apply(lambda r: ", ".join(f"{k}={r[k]}" for k in ("representation", "heads", "context", "d_h", "d", "N",
                                                                     "seed") if k in r and pd.notna(r[k])), axis=1)
    paper_a, dana = _paper_a_bounds(frame, label_bits)
    return pd.DataFrame({"room": "memorize", "experiment": experiment, "config": config,
                         "stored_bits": frame["memorized"] * label_bits, "parameters": parameters, "formula": formula,
                         "converged": _attention_converged(frame), "bound_bits_paper_a": paper_a, "bound_bits_dana": dana})


def capacity_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit capacity`` (a layer with d_h = d_v = d on reduced real tokens)."""
    if "parameters" not in frame:
        frame = frame.assign(parameters=frame.apply(lambda r: _layer_parameters(r, d_v=int(r["d"])), axis=1))
    return memorize_bits(frame.assign(task="classification"), "capacity")


def certify_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit certify``: guaranteed exact reals at float32 precision (one label per example)."""
    parameters = frame.apply(lambda r: _layer_parameters(r, d_v=int(r["d_h"])), axis=1)
    config = frame.apply(lambda r: f"weights={r['weights']}, heads={r['heads']}, context={r['context']}, "
                                   f"d_h={r['d_h']}, d={r['d']}, N={r['N']}, seed={r['seed']}", axis=1)
    paper_a, dana = _paper_a_bounds(frame, pd.Series(float(REAL_BITS), index=frame.index))
    return pd.DataFrame({"room": "memorize", "experiment": "certify", "config": config,
                         "stored_bits": frame["guaranteed"] * REAL_BITS, "parameters": parameters,
                         "formula": f"guaranteed x {REAL_BITS} (exact reals at float32 precision)",
                         "converged": True, "bound_bits_paper_a": paper_a, "bound_bits_dana": dana})


def facts_bits(frame: pd.DataFrame, experiment: str = "facts") -> pd.DataFrame:
    """Rows of a trained ``audit facts`` experiment (columns facts_stored, values, parameters)."""
    if "tau" in frame:  # one training, one row per softmax threshold: count it once
        frame = frame.drop_duplicates([c for c in ("unit", "db", "d_model", "heads", "d_qk", "d_vo", "seed") if c in frame])
    config = frame.apply(lambda r: ", ".join(f"{k}={r[k]}" for k in ("db", "d_model", "heads", "d_qk", "d_vo", "seed")
                                             if k in r), axis=1)
    return pd.DataFrame({"room": "facts", "experiment": experiment, "config": config,
                         "stored_bits": frame["facts_stored"] * np.log2(frame["values"].astype(float)),
                         "parameters": frame["parameters"], "formula": "facts_stored x log2(values)",
                         "converged": frame["early_stopped"].astype(bool) if "early_stopped" in frame else None})


def recall_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit recall scaling`` (facts stored) or ``recall tradeoff`` (fact_recall of all facts).

    ``converged``: the CSV's own column where it has one (the threshold was reached or the accuracy
    plateaued); for a trade-off CSV without it, an early stop (steps_trained < the budget ``steps``: every
    fact recalled) or False (it ran its whole budget); empty (unknown) where the CSV records neither."""
    if "answers_per_relation" not in frame:
        raise KeyError("D (answers_per_relation: log2 D bits per fact)")
    tradeoff = "fact_recall" in frame
    facts = (frame["fact_recall"] * frame["facts"]).round() if tradeoff else frame["facts"]
    keys = ("subjects", "relations", "d", "heads", "head_dim", "width", "seed", "budget")
    config = frame.apply(lambda r: ", ".join(f"{k}={r[k]}" for k in keys if k in r), axis=1)
    if "converged" in frame:
        converged = _flags(frame["converged"])
    elif tradeoff and {"steps_trained", "steps"} <= set(frame):  # early stop = every fact recalled
        converged = (frame["steps_trained"] < frame["steps"]).astype(object)
    else:
        converged = _unknown(frame)
    return pd.DataFrame({"room": "recall", "experiment": "recall tradeoff" if tradeoff else "recall scaling",
                         "config": config, "stored_bits": facts * np.log2(frame["answers_per_relation"].astype(float)),
                         "parameters": frame["parameters"],
                         "formula": "fact_recall x facts x log2(D)" if tradeoff else "facts x log2(D)",
                         "converged": converged})


def assoc_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit assoc``: N associations x -> x over N outputs store log2(N) bits each."""
    config = frame.apply(lambda r: f"kind={r['kind']}, d={r['d']}, width={r['width']}, seed={r['seed']}", axis=1)
    converged = _flags(frame["converged"]) if "converged" in frame else _unknown(frame)
    return pd.DataFrame({"room": "assoc", "experiment": "assoc", "config": config,
                         "stored_bits": frame["capacity"] * np.log2(frame["capacity"].clip(lower=1).astype(float)),
                         "parameters": frame["parameters"], "formula": "capacity x log2(capacity)",
                         "converged": converged})


def _reader(columns: set[str]) -> tuple[Callable[[pd.DataFrame], pd.DataFrame], str] | None:
    """Which room wrote a CSV with these columns (None: nothing stored to count, e.g. rank-only tables)."""
    if "guaranteed" in columns and "weights" in columns and "memorized" not in columns:
        return certify_bits, "certify"
    if "memorized" in columns and "representation" in columns:
        return capacity_bits, "capacity"
    if "memorized" in columns:
        return memorize_bits, "memorize"
    if "facts_stored" in columns:
        return facts_bits, "facts"
    if "fact_recall" in columns or {"facts", "bits"} <= columns:  # D or answers_per_relation: checked on reading
        return recall_bits, "recall"
    if {"capacity", "kind"} <= columns:
        return assoc_bits, "assoc"
    return None


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _check_counts(rows: pd.DataFrame, file: Path, room: str) -> None:
    """Refuse a CSV whose rows cannot be counted: stored bits must be finite and >= 0, parameters finite and
    > 0 (a foreign CSV with negative counts, a class count of 0 or no parameters would give negative or
    infinite bits per parameter). Names the file and the first bad row (its line in the file)."""
    bits = pd.to_numeric(rows["stored_bits"], errors="coerce").astype(float)
    params = pd.to_numeric(rows["parameters"], errors="coerce").astype(float)
    checks = ((~np.isfinite(bits), "stored bits {} (from its counts) are not a finite number"),
              (bits < 0, "stored bits {} are negative (a negative count, or fewer than 1 class, value or answer)"),
              (~np.isfinite(params), "its parameters {} are not a finite number"),
              (params <= 0, "its parameters {} are not positive"))
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
    frames = []
    for file in files:
        try:
            head = pd.read_csv(file, nrows=0)
        except (ValueError, UnicodeDecodeError) as err:  # empty, binary or malformed: name the file, one line
            raise AuditError(f"{file}: not a readable result CSV ({_first_line(err)})") from None
        found = _reader(set(head.columns))
        if found is None:
            continue
        reader, room = found
        try:
            rows = reader(pd.read_csv(file))
        except KeyError as err:
            missing = err.args[0] if err.args else "?"
            raise AuditError(f"{file}: a {room} result CSV without the column {missing}; "
                             f"columns: {', '.join(map(str, head.columns))}") from None
        except (ValueError, TypeError, UnicodeDecodeError) as err:
            raise AuditError(f"{file}: cannot count the bits of this {room} result CSV ({_first_line(err)})") from None
        if room == "facts":  # the facts experiments keep one folder each (reports/facts/width, ...)
            parts = file.parent.parts
            rows["experiment"] = " ".join(["facts", *parts[parts.index("facts") + 1:]] if "facts" in parts
                                          else ["facts", file.parent.name])
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
        out.append({"room": room, "experiment": experiment, "rows": len(part),
                    "converged": int((kind == CONVERGED).sum()), "step-limited": int((kind == STEP_LIMITED).sum()),
                    "not recorded": int((kind == NOT_RECORDED).sum()),
                    "median (converged)": done.median(), "min (converged)": done.min(),
                    "max (converged)": done.max(), "median (all rows)": bpp.median(), "max (all rows)": bpp.max()})
    return pd.DataFrame(out)


def draw_bits(table: pd.DataFrame, ax: Any) -> Any:
    """Bits per parameter against parameters on ``ax``, one color per room and experiment, one marker per
    convergence class (filled: converged; faint hollow triangle: step-limited; hollow diamond: convergence not
    recorded), with the reference lines and the paper-A bounds at the same configurations (small hollow circle:
    H(n-1)+1, plus: H d_h + d). Every artist that stands for a class is labelled in the legend."""
    from auditor.lab.figures import plt

    groups = list(table.groupby(["room", "experiment"], sort=True))
    colors = plt.cm.tab10(np.linspace(0, 1, 10))
    classes = table["converged"].map(convergence_class)
    for color, ((room, experiment), part) in zip(colors, groups):
        kind = classes.loc[part.index]
        counts = [f"{int((kind == c).sum())} {name}" for c, name in ((CONVERGED, "converged"),
                                                                      (STEP_LIMITED, "step-limited"),
                                                                      (NOT_RECORDED, "not recorded"))
                  if (kind == c).any()]
        ax.plot([], [], color=color, lw=5, label=f"{room}: {experiment} ({len(part)} rows: {', '.join(counts)})")
        for name, style in _STYLE.items():
            rows = part[kind == name]
            if len(rows):
                ax.scatter(rows["parameters"], rows["bits_per_parameter"], s=16, marker=style["marker"],
                           color=color, facecolors=color if style["filled"] else "none", alpha=style["alpha"],
                           lw=0.8, gid=name)
        for column, marker in (("bound_bits_paper_a", "o"), ("bound_bits_dana", "+")):
            bound = pd.to_numeric(part[column], errors="coerce")
            if bound.notna().any():
                ax.scatter(part["parameters"], bound / part["parameters"], s=9, marker=marker, color=color,
                           facecolors="none" if marker == "o" else color, lw=0.5, alpha=0.5, gid="bound")
    for name, style in _STYLE.items():
        ax.scatter([], [], s=16, marker=style["marker"], color="k", facecolors="k" if style["filled"] else "none",
                   alpha=max(style["alpha"], 0.5), lw=0.8, label=_KEY[name])
    ax.scatter([], [], s=9, marker="o", facecolors="none", color="k", lw=0.5,
               label="paper A: H(n-1)+1 examples, same unit (small hollow circle)")
    ax.scatter([], [], s=9, marker="+", color="k", lw=0.5, label="Dana et al.: H d_h + d examples, same unit")
    for label, value in REFERENCES.items():
        ax.axhline(value, color="gray", ls="--" if value == 2.0 else ":", lw=1, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("trainable parameters")
    ax.set_ylabel("bits_per_parameter (stored bits / parameters)")
    return ax


def plot_bits(table: pd.DataFrame, path: str | Path) -> Path:
    """``draw_bits`` saved as a PNG, the legend beside the axes."""
    from auditor.lab.figures import plt, save

    fig, ax = plt.subplots(figsize=(11.5, 5.6))
    draw_bits(table, ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return save(fig, path, title="stored bits per parameter, every room")


@click.command("bits", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("report_dirs", nargs=-1)
@click.option("--out", default="reports/bits", show_default=True, help="Folder for bits.csv and bits.png.")
@click.option("--plots/--no-plots", default=True, show_default=True, help="Draw bits.png.")
def bits_command(report_dirs: tuple[str, ...], out: str, plots: bool) -> None:
    """Stored bits per trainable parameter of every room's results (memorize, certify, capacity, facts,
    recall, assoc), with each row's formula; REPORT_DIRS default to reports/memorize reports/facts
    reports/assoc."""
    from auditor.lab.sweep import write_table

    dirs = report_dirs or ("reports/memorize", "reports/facts", "reports/assoc")
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
    click.echo("\nmedian, min and max (converged): over the converged rows only (empty where none converged); "
               "(all rows): step-limited rows and rows whose convergence is not recorded included.")
    unknown = table.loc[table["converged"].isna(), "source"].value_counts(sort=False)
    if len(unknown):
        click.echo("\nconvergence not recorded (convergence unknown, empty `converged`: the CSV records neither a "
                   "convergence flag nor a step budget to compare with): " + "; ".join(f"{source} ({n} rows)" for source, n in unknown.items()))
    click.echo(f"\nbits per parameter: {folder / 'bits.csv'}" + (f"; plot: {folder / 'bits.png'}" if plots else ""))
