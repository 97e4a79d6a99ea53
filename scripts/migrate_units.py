"""Move lab output folders written before resume keys left out defaults (unit files of format /1 and /2)
to the keys of this release, once. Run it on a folder before resuming into it:

    python scripts/migrate_units.py runs/fig2a reports/memorize      # folders, searched recursively

Per sweep folder (one holding ``units/`` or a CSV with a ``unit`` column):

* every ``units/<key>.json`` is re-keyed: its configuration takes the names of this release (a memorize
  unit's ``tolerance`` and ``rank_rtol``, a certify unit's ``train_steps``), its rows too when the file
  predates the column renames (format /1), and the key is :func:`auditor.lab.sweep.unit_key` with the
  experiment's declared defaults;
* every CSV with a ``unit`` column (``results.csv``, side tables, copies such as ``capacity.csv``) gets the
  new keys and configurations, and its columns the names of this release where it still has old ones; a
  committed facts folder keeps its configurations once per unit in ``unit_configs.json`` (key ->
  configuration) instead of a ``unit_config`` column, re-keyed the same way;
* files named by an old key (checkpoints, histories, curves) are renamed, and the old key is replaced
  wherever a CSV cell names such a file.

``--rebuild-units``: a folder that kept only its CSV (the committed reports) also gets ``units/`` back from
its rows, so that rerunning its command resumes instead of recomputing. Running the script twice changes
nothing the second time. A unit whose training had not finished has no unit file; its checkpoint is renamed
only when a finished unit names it, otherwise the unit trains again.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from auditor.core.atomic import write_text_atomic
from auditor.lab.room import get
from auditor.lab.sweep import _dumps, unit_key

OLD_FORMATS = ("attention-auditor-unit/1", "attention-auditor-unit/2")
ROWS_RENAMED_AFTER = "attention-auditor-unit/1"  # rows of this format still carry the old column names

# Entry names a unit's configuration was hashed with before this release, per experiment: {entry: {old: new}}.
CONFIG_RENAMES: dict[str, dict[str, dict[str, str]]] = {
    "memorize": {"settings": {"tolerance": "error_tolerance", "rank_rtol": "rtol"}},
    "memorize shared-queries": {"settings": {"tolerance": "error_tolerance", "rank_rtol": "rtol"}},
    "capacity": {"train": {"tolerance": "error_tolerance", "rank_rtol": "rtol"}},
    "certify": {"request": {"train_steps": "steps"}},
    **{f"facts {name}": {"cp": {"tol": "tolerance"}} for name in ("tau", "bound", "scale")},
}

# Column names of earlier releases, per experiment (applied all at once: ``steps`` was the steps trained
# where ``max_steps`` was the budget).
_MEMORIZE = {
    "tolerance": "error_tolerance",
    "rank_rtol": "rtol",
    "steps": "steps_trained",
    "max_steps": "steps",
    "bound": "lower_bound",
    "certified": "readout_hits",
    "certified_init": "readout_hits_init",
}
_FACTS = {
    "params": "parameters",
    "cp_tol": "cp_tolerance",
    "rank_lower": "bounds_lower",
    "rank_upper": "bounds_upper",
    "rank_exact": "bounds_exact",
    "db_rank_lower": "bounds_lower",
    "db_rank_upper": "bounds_upper",
    "db_cp_rank": "cp_rank",
    "total_seconds": "seconds",
    "members_in_batch": "bucket_members",
}
_BOUND_PARTS = (
    "bound",
    "joint",
    "key_side",
    "query_side",
    "slice_bound",
    "construction",
    "direct_rank",
    "attention_ranks",
    "value_ranks",
    "flattening_lower",
    "cp_rank",
    "cp_reached_by",
    "cp_seconds",
)
_RECALL = {
    "params": "parameters",
    "params_with_bias": "parameters_with_bias",
    "facts_per_param": "facts_per_parameter",
    "bits_per_param": "bits_per_parameter",
    "attention_params": "attention_parameters",
    "mlp_params": "mlp_parameters",
    "max_steps": "steps",
    "steps": "steps_trained",
    "T": "prompt_length",
    "D": "answers_per_relation",
    "seconds_unit": "seconds",
    "seconds_train": "train_seconds",
    "model": "architecture",
}
COLUMN_RENAMES: dict[str, dict[str, str]] = {
    "memorize": _MEMORIZE,
    "capacity": {**_MEMORIZE, "scale": "token_rms"},
    "certify": {"rank_rtol": "rtol", "train_steps": "steps_trained", "certified": "readout_hits",
                "bound": "lower_bound"},
    "facts bound": {**{k: f"layer_{k}" for k in _BOUND_PARTS}, "cp_tol": "cp_tolerance"},
    "assoc": {"m": "width", "params": "parameters", "max_steps": "steps", "seconds_bucket": "seconds"},
    "recall scaling": _RECALL,
    "recall tradeoff": _RECALL,
    "recall dynamics": {"seconds_run": "seconds"},
}


def experiment_of(config: Mapping[str, Any]) -> str:
    """The registered experiment a unit configuration belongs to."""
    kind = config.get("kind")
    if kind in ("memorize", "certify", "capacity"):
        return str(kind)
    if kind == "memorize-shared-queries":
        return "memorize shared-queries"
    if kind == "dynamics":
        return "recall dynamics"
    if kind in ("linear", "mlp"):
        return "assoc"
    if "experiment" in config:
        name = str(config["experiment"])
        return "facts scale" if name.startswith("scale-") else f"facts {name}"
    if "widths" in config:
        return "recall tradeoff"
    if "width_ratios" in config:
        return "recall scaling"
    raise ValueError(f"cannot tell which experiment wrote the unit {_dumps(config)[:200]}")


def column_renames(name: str) -> dict[str, str]:
    return COLUMN_RENAMES.get(name, _FACTS if name.startswith("facts ") else {})


def migrate_config(config: Mapping[str, Any]) -> tuple[str, dict[str, Any], str]:
    """(experiment, the configuration in this release's names, its key)."""
    name = experiment_of(config)
    out = dict(config)
    for entry, renames in CONFIG_RENAMES.get(name, {}).items():
        if isinstance(out.get(entry), Mapping):
            out[entry] = {renames.get(k, k): v for k, v in out[entry].items()}
    return name, out, unit_key(out, get(name).key_defaults)


def _renamed_columns(columns: Iterable[str], name: str) -> dict[str, str]:
    """The renames a table with ``columns`` needs: all of the experiment's at once when it holds a column
    that is no longer written, none otherwise (a current table keeps ``steps``, the budget)."""
    renames = column_renames(name)
    current = set(get(name).columns)
    old = [c for c in columns if c in renames and c not in current]
    return renames if old else {}


def _replace_keys(value: Any, keys: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        for old, new in keys.items():
            if old in value:
                value = value.replace(old, new)
    return value


def migrate_units(units: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Re-key every unit file in ``units``; returns (old key -> new key, new key -> configuration)."""
    keys, configs = {}, {}
    files = sorted(units.glob("*.json"))
    payloads = {path: json.loads(path.read_text()) for path in files}
    for path, payload in payloads.items():
        name, config, key = migrate_config(payload["config"])
        keys[path.stem], configs[key] = key, config
    for path, payload in payloads.items():
        name, config, key = migrate_config(payload["config"])
        rows = payload["rows"]
        if payload.get("format") == ROWS_RENAMED_AFTER:
            renames = column_renames(name)
            rows = [{renames.get(k, k): v for k, v in row.items()} for row in rows]
        text = _dumps(config)
        rows = [{k: (key if k == "unit" else text if k == "unit_config" else _replace_keys(v, keys))
                 for k, v in row.items()} for row in rows]
        write_text_atomic(
            units / f"{key}.json", _dumps({"key": key, "config": config, "rows": rows}, sort_keys=False)
        )
        if path.stem != key and path.exists():
            path.unlink()
    return keys, configs


def _read_csv(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as fh:
        table = list(csv.reader(fh))
    return (table[0], table[1:]) if table else ([], [])


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_text_atomic(path, buffer.getvalue())


def learn_keys(path: Path, keys: dict[str, str]) -> None:
    """Add old key -> new key for the units whose configuration a CSV records."""
    header, rows = _read_csv(path)
    if "unit" in header and "unit_config" in header:
        unit, config_at = header.index("unit"), header.index("unit_config")
        for row in rows:
            if row[config_at]:
                keys.setdefault(row[unit], migrate_config(json.loads(row[config_at]))[2])


def migrate_configs_table(path: Path, keys: dict[str, str]) -> bool:
    """Re-key a ``unit_configs.json`` (key -> configuration); adds its old -> new keys to ``keys``."""
    table = json.loads(path.read_text())
    out = {}
    for old, config in table.items():
        name, config, key = migrate_config(config)
        keys.setdefault(old, key)
        out[key] = config
    text = json.dumps(out, indent=1, sort_keys=True) + "\n"
    if text == path.read_text():
        return False
    write_text_atomic(path, text)
    return True


def migrate_csv(
    path: Path, keys: Mapping[str, str], old_configs: Mapping[str, Mapping[str, Any]] | None = None
) -> bool:
    """Move one CSV with a ``unit`` column to this release: the new keys (``keys``: old -> new, also where a
    cell names a file by its key), configurations in this release's names and, where it still has columns
    of an earlier release, their names now. ``old_configs``: old key -> configuration, for a table without
    a ``unit_config`` column (a facts folder's ``unit_configs.json``). Returns whether the file changed."""
    header, rows = _read_csv(path)
    if "unit" not in header:
        return False
    unit = header.index("unit")
    config_at = header.index("unit_config") if "unit_config" in header else None
    names = (
        {experiment_of(old_configs[row[unit]]) for row in rows}
        if old_configs and config_at is None
        else set()
    )
    for row in rows:
        if config_at is not None and row[config_at]:
            name, config, _ = migrate_config(json.loads(row[config_at]))
            row[config_at] = _dumps(config)
            names.add(name)
        row[:] = [keys.get(cell, cell) if i == unit else cell if i == config_at else _replace_keys(cell, keys)
                  for i, cell in enumerate(row)]
    renames = {}
    for name in names:
        renames.update(_renamed_columns(header, name))
    new_header = [renames.get(c, c) for c in header]
    if len(set(new_header)) != len(new_header):
        raise ValueError(f"{path}: renaming the columns of an earlier release would repeat one: {new_header}")
    before = path.read_text()
    _write_csv(path, new_header, rows)
    return path.read_text() != before


def _cell(text: str) -> Any:
    """A CSV cell as the unit row held it: empty -> None, numbers and booleans typed, the rest as text."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def rebuild_units(folder: Path, csv_path: Path) -> int:
    """Write ``folder/units`` from the rows of ``csv_path`` (after :func:`migrate_csv`); returns the count."""
    header, rows = _read_csv(csv_path)
    table = folder / "unit_configs.json"
    configs = json.loads(table.read_text()) if table.is_file() else {}
    if "unit" not in header or ("unit_config" not in header and not configs):
        return 0
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        record = {c: (cell if c in ("unit", "unit_config") else _cell(cell)) for c, cell in zip(header, row)}
        grouped.setdefault(record["unit"], []).append(record)
        if "unit_config" in record:
            configs[record["unit"]] = json.loads(record["unit_config"])
    units = folder / "units"
    units.mkdir(exist_ok=True)
    for key, unit_rows in grouped.items():
        config = configs[key]
        write_text_atomic(units / f"{key}.json", _dumps({"key": key, "config": config, "rows": unit_rows},
                                                        sort_keys=False))
    for side in SIDE_FOLDERS:  # a side table the report gathered (tolerance.csv) back into one file per unit
        gathered = folder / f"{side}.csv"
        side_header, side_rows = _read_csv(gathered) if gathered.is_file() else ([], [])
        if "unit" in side_header and not (folder / side).exists():
            at = side_header.index("unit")
            for key in dict.fromkeys(row[at] for row in side_rows):
                (folder / side).mkdir(exist_ok=True)
                _write_csv(
                    folder / side / f"{key}.csv", side_header, [row for row in side_rows if row[at] == key]
                )
    return len(grouped)


SIDE_FOLDERS = (
    "history",
    "saturation",
    "tolerance",
    "curves",
    "checkpoints",
)  # files a unit names by its key


def _own_files(folder: Path) -> list[Path]:
    """The files of a sweep folder: its own, and those of its side folders (not those of nested sweeps)."""
    files = [p for p in folder.iterdir() if p.is_file()]
    for side in SIDE_FOLDERS:
        if (folder / side).is_dir():
            files += [p for p in (folder / side).rglob("*") if p.is_file()]
    return sorted(files)


def migrate_folder(folder: Path, *, rebuild: bool = False) -> list[str]:
    """Migrate one sweep folder; returns what changed, one line each."""
    done = []
    keys: dict[str, str] = {}
    units = folder / "units"
    if units.is_dir():
        keys, configs = migrate_units(units)
        done.append(f"{folder}: {len(configs)} unit files re-keyed")
    table = folder / "unit_configs.json"
    old_configs = json.loads(table.read_text()) if table.is_file() else None
    if old_configs is not None and migrate_configs_table(table, keys):
        done.append(f"{table}: keys and configurations of this release")
    tables = [p for p in _own_files(folder) if p.suffix == ".csv"]
    for path in tables:  # first every old key this folder records, then the files that name them
        learn_keys(path, keys)
    for path in tables:
        if migrate_csv(path, keys, old_configs if path.parent == folder else None):
            done.append(f"{path}: keys, configurations and column names of this release")
    for path in _own_files(folder):
        if path.stem in keys and keys[path.stem] != path.stem:
            path.rename(path.with_name(keys[path.stem] + path.suffix))
    if rebuild and not units.is_dir() and (folder / "results.csv").is_file():
        done.append(
            f"{folder}: {rebuild_units(folder, folder / 'results.csv')} unit files rebuilt from results.csv"
        )
    return done


def sweep_folders(root: Path) -> list[Path]:
    """``root`` and the folders under it that hold units or a CSV with a ``unit`` column (outermost first,
    a folder inside another's ``units``, ``history`` etc. excluded)."""
    found = []
    for folder in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if any(part in ("units", *SIDE_FOLDERS) for part in folder.relative_to(root).parts):
            continue
        has_units = (folder / "units").is_dir()
        has_csv = any("unit" in _read_csv(p)[0] for p in folder.glob("*.csv"))
        if has_units or has_csv:
            found.append(folder)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--rebuild-units", action="store_true",
                        help="Give a folder that kept only results.csv its units/ back (to resume into it).")
    args = parser.parse_args(argv)
    for root in args.folders:
        if not root.is_dir():
            sys.stderr.write(f"error: {root} is not a folder\n")
            return 2
        for folder in sweep_folders(root):
            for line in migrate_folder(folder, rebuild=args.rebuild_units):
                sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
