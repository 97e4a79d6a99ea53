"""Resumable sweeps: work units keyed by the hash of their configuration, rows written atomically.

A unit's key (:func:`unit_key`) hashes what defines its work: the configuration less its location
(``workdir``) and less every entry equal to its *declared default* (an experiment's ``key_defaults``,
shaped like its units). A field added with a default therefore keys no finished unit anew, and no
field needs an old name kept for the sake of a key. A finished unit's key does not say what its entries
at their default were, so changing a declared default would hand it to the new default: change a preset
instead, or migrate the folders (``scripts/migrate_units.py``); ``tests/lab/test_key_defaults.py`` holds
the declared defaults and fails on a change.

A sweep is a list of *units*. A unit is a JSON-serialisable configuration dict; the function that runs
it returns one row (a dict) or a list of rows, with typed values (numbers, booleans, strings, and lists
or dicts that the CSV writer stores as JSON). Each finished unit's rows are written at once to
``<out>/units/<key>.json`` through a temporary file, ``fsync`` and ``os.replace``, so a killed sweep
never leaves a corrupt or partial unit file and never loses a finished unit. Rerunning the same sweep
skips the units whose files are complete and rebuilds ``<out>/results.csv`` from all unit files in the
order of the configurations, so an interrupted-and-resumed sweep produces the same CSV as an
uninterrupted one. A unit file that is unreadable, truncated or written for another configuration is
ignored (with a warning) and its unit is run again.

Provenance is stamped here, once, on every row, by the process that ran the unit: ``device`` (the
device the unit computed on; units that choose one report it, the others ran on the CPU), ``seed``,
``git_commit`` and ``versions`` (:func:`stamp`), then ``unit`` (the key) and ``unit_config`` (the
resolved configuration as JSON): calling the sweep's unit function on ``json.loads(row["unit_config"])``
at the row's ``git_commit`` reproduces the row. Side tables a unit writes (training histories,
tolerance curves) go through :func:`write_table`, which stamps the same columns.

Executors (:mod:`auditor.core.execution`): ``local`` (in this process, one unit after the other), ``ray``
(each unit a Ray task) and ``slurm`` (each unit a task of one Slurm job array, logs in ``<out>/slurm``).
Under ``local`` and ``ray`` only this process writes unit files (Ray workers return rows); a Slurm job
writes its own unit's file, through the same atomic write, so units finished by jobs survive this
process, and a rerun attaches to the jobs still queued or running (:mod:`auditor.core.slurm`). One sweep at a
time may write into a folder (an advisory lock on ``<out>/units``); leftover temporary files of a killed
sweep are removed on resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from auditor.core.atomic import (
    TMP_SUFFIX,
    confined,
    output_root,
    real_folder,
    write_csv_atomic,
    write_text_atomic,
)
from auditor.core.errors import AuditError
from auditor.core.execution import check_executor, check_resources, run_each
from auditor.core.provenance import provenance
from auditor.core.slurm import SlurmOptions

log = logging.getLogger(__name__)

UnitFn = Callable[[dict[str, Any]], "dict[str, Any] | list[dict[str, Any]]"]
KeyDefaults = Mapping[str, Any] | type  # entry -> default, dataclass or [dataclass]; see key_fields
LOCATION_KEYS = ("workdir",)  # say where a unit keeps side files, not what it computes: not in the key
PROVENANCE = ("device", "seed", "git_commit", "versions")  # stamped on every row of every lab CSV
RUNNER = ("unit", "unit_config")  # added by the sweep runner


def _jsonable(value: Any) -> Any:
    """JSON fallback: numpy / torch scalars as Python numbers, anything else as its string."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return str(value)


def _dumps(payload: Any, *, sort_keys: bool = True) -> str:
    return json.dumps(payload, sort_keys=sort_keys, default=_jsonable, separators=(",", ":"))


def field_defaults(cls: type) -> dict[str, Any]:
    """The default of every field of the dataclass ``cls`` that has one (as a unit stores it: JSON)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        out[f.name] = json.loads(
            _dumps(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value)
        )
    return out


def _defaults(declared: Any) -> Mapping[str, Any] | None:
    """The entry defaults a declaration stands for when it describes a dict (a dataclass), else None."""
    return (
        field_defaults(declared)
        if isinstance(declared, type) and dataclasses.is_dataclass(declared)
        else None
    )


def key_fields(config: Mapping[str, Any], defaults: KeyDefaults | None = None) -> dict[str, Any]:
    """What a unit's key hashes: ``config`` less its ``LOCATION_KEYS`` and less every entry equal to its
    declared default. ``defaults`` (a mapping, or a dataclass standing for its fields' defaults) maps an
    entry to its default value, to a dataclass (the entry is a dict of that dataclass's fields, each left
    out at its default) or to ``[dataclass]`` (a list of such dicts)."""
    defaults = _defaults(defaults) or defaults or {}
    out = {}
    for name, value in config.items():
        declared = defaults.get(name, dataclasses.MISSING)
        if name in LOCATION_KEYS or (
            declared is not dataclasses.MISSING and _dumps(value) == _dumps(declared)
        ):
            continue
        if isinstance(declared, list) and len(declared) == 1 and _defaults(declared[0]) is not None:
            value = [key_fields(v, declared[0]) if isinstance(v, Mapping) else v for v in value]
        elif _defaults(declared) is not None and isinstance(value, Mapping):
            value = key_fields(value, declared)
        out[name] = value
    return out


def unit_key(config: Mapping[str, Any], defaults: KeyDefaults | None = None) -> str:
    """Stable 16-hex-digit key of a resolved configuration: the hash of its :func:`key_fields` (the order
    of keys does not matter; a moved output folder and a field added at its default keep the key)."""
    return hashlib.sha256(_dumps(key_fields(config, defaults)).encode()).hexdigest()[:16]


def file_fingerprint(path: str | Path) -> str:
    """First 16 hex digits of a file's SHA-256 (an input file in a unit: changed content, new unit)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def stamp(row: Mapping[str, Any], *, device: str = "cpu", seed: Any = None) -> dict[str, Any]:
    """``row`` with the provenance columns: its own ``device`` and ``seed`` when it has them (else the
    arguments), and ``git_commit`` and ``versions`` of this process."""
    out = dict(row)
    out.setdefault("device", device)
    out.setdefault("seed", seed)
    return {**out, **provenance()}


def write_table(frame: pd.DataFrame, path: str | Path, *, device: str = "cpu", seed: Any = None,
                unit: str | None = None) -> Path:
    """Write a side table as CSV (atomically), every row stamped like a sweep row (:func:`stamp`), with the
    key of the ``unit`` that wrote it (its configuration is that unit's ``unit_config`` in results.csv)."""
    rows = [
        stamp(row, device=device, seed=seed) | ({"unit": unit} if unit else {})
        for row in frame.to_dict("records")
    ]
    columns = list(dict.fromkeys([*frame.columns, *PROVENANCE, *(["unit"] if unit else [])]))
    write_csv_atomic(_cells(pd.DataFrame(rows, columns=columns)), Path(path))
    return Path(path)


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write rows that carry their provenance already (e.g. several sweeps' results) as CSV, atomically."""
    write_csv_atomic(_cells(frame), Path(path))
    return Path(path)


def _cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Lists and dicts as JSON text (sorted keys), the rest as it is: what the CSV writer stores."""
    out = frame.copy()
    for column in out.columns:
        if out[column].dtype == object:
            out[column] = out[column].map(
                lambda v: json.dumps(v, sort_keys=True) if isinstance(v, list | dict) else v
            )
    return out


def _as_rows(result: Any, config: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [result] if isinstance(result, dict) else result
    if not isinstance(rows, list | tuple) or not all(isinstance(r, dict) for r in rows):
        raise TypeError(f"a sweep unit must return a dict or a list of dicts; got {type(result).__name__} "
                        f"for unit {config}")
    return list(rows)


def run_unit(fn: UnitFn, config: dict[str, Any], root: str | None = None) -> list[dict[str, Any]]:
    """Run one unit and stamp its rows (in the process that ran it, so a worker reports its own versions).
    ``root``: the output folder its side files are confined to (:func:`auditor.core.atomic.confined`; a Ray
    worker does not share the driver's)."""
    with confined(root):
        return [stamp(row, seed=config.get("seed")) for row in _as_rows(fn(config), config)]


def _read_unit(path: Path, defaults: KeyDefaults | None = None) -> list[dict[str, Any]] | None:
    """Rows of a finished unit, or None when the file is missing or not a complete unit file."""
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        log.warning("unit file %s is unreadable or truncated; its unit will run again", path)
        return None
    rows = payload.get("rows") if isinstance(payload, dict) else None
    config = payload.get("config") if isinstance(payload, dict) else None
    if (
        not isinstance(rows, list)
        or not all(isinstance(r, dict) for r in rows)
        or not isinstance(config, dict)
    ):
        log.warning("unit file %s is not a complete unit record; its unit will run again", path)
        return None
    if unit_key(config, defaults) != path.stem:
        log.warning("unit file %s holds another configuration; its unit will run again", path)
        return None
    return rows


def missing_parents(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet (deepest first)."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


def remove_empty(folders: Sequence[Path]) -> None:
    """rmdir each folder (deepest first) while it is empty; never deletes a file."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _check_out(out: Path) -> Path:
    try:
        real_folder(out / "units")  # a link planted at units/ is replaced: unit files stay inside out
    except OSError as err:
        raise AuditError(
            f"cannot write to output folder {str(out)!r} ({err.strerror}); choose a writable --out"
        ) from None
    if not os.access(out / "units", os.W_OK):
        raise AuditError(f"output folder {str(out)!r} is not writable; choose a writable --out")
    return out


@contextlib.contextmanager
def _exclusive(units: Path) -> Iterator[None]:
    """Hold an advisory lock on the units folder; another live sweep on the same folder is an error."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield
        return
    fd = os.open(units, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AuditError(
                f"another sweep is writing into {str(units.parent)!r}; wait for it or choose another --out"
            ) from None
        except OSError:  # file systems without flock support: proceed unlocked
            log.warning("cannot lock %s; make sure no other sweep writes into it", units)
        # temporary files of a sweep that was killed mid-write (never read; the real files are complete)
        for stale in [*units.glob(f".*{TMP_SUFFIX}"), *units.parent.glob(f".results.csv.*{TMP_SUFFIX}")]:
            stale.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # releases the lock


def run_sweep(
    fn: UnitFn,
    configs: Sequence[dict[str, Any]],
    out: str | Path,
    *,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
    desc: str = "sweep",
    num_cpus: float = 1,
    num_gpus: float = 0,
    columns: Sequence[str] | None = None,
    key_defaults: KeyDefaults | None = None,
    slurm: SlurmOptions | None = None,
) -> pd.DataFrame:
    """Run every configuration not yet finished in ``out``; return (and write) all rows.

    Args:
        fn: runs one unit; a module-level function (Ray ships it to the workers by reference).
        configs: resolved configurations, each JSON-serialisable and distinct.
        out: folder for ``units/<key>.json`` and ``results.csv``; nothing is written elsewhere.
        executor: ``local``, ``ray`` or ``slurm``.
        address: Ray cluster address (``auto``, ``host:port``, ``ray://host:10001``). None: the Ray
            instance this process already joined, else Ray's own discovery (``RAY_ADDRESS``, then a
            ``ray start`` cluster on this machine), else a new local instance.
        progress: show a progress bar (on a terminal only).
        num_cpus, num_gpus: resources each Ray task reserves (ignored by ``local``).
        columns: the row schema: a unit returning a column outside it (and outside the provenance
            columns) is a programming error; columns are written in this order.
        key_defaults: the declared defaults of the units' entries, left out of their keys
            (:func:`key_fields`).
        slurm: the resources of each Slurm job (``slurm``; default :class:`~auditor.core.slurm.SlurmOptions`),
            logs in ``<out>/slurm`` unless it names a folder.

    A unit that raises stops a local sweep at once; under Ray and Slurm the units already submitted still
    finish and are written, then the first error is raised. Either way finished units stay on disk,
    and a failed sweep that finished nothing leaves no folder behind.
    """
    check_executor(executor)  # before the output folder exists
    check_resources(num_cpus=num_cpus, num_gpus=num_gpus)
    if not configs:
        raise AuditError("the sweep lists no configurations; give at least one")
    keys = [unit_key(c, key_defaults) for c in configs]
    if len(set(keys)) != len(keys):
        raise AuditError("the sweep lists the same configuration twice; every unit must be distinct")
    out = Path(out)
    created = missing_parents(out / "units")
    root = output_root() or Path(os.path.abspath(out))  # the command's --out, else this sweep's folder
    written = 0
    try:
        with confined(root):
            out = _check_out(out)
        units = out / "units"
        with confined(root), _exclusive(units):
            pending = [
                (k, c) for k, c in zip(keys, configs) if _read_unit(units / f"{k}.json", key_defaults) is None
            ]
            # progress on a terminal only: logs and pipes (Slurm, CI) get no carriage-return noise
            with tqdm(total=len(configs), initial=len(configs) - len(pending), desc=desc,
                      disable=None if progress else True) as bar:
                worker, calls = run_unit, [(fn, config, str(root)) for _, config in pending]
                if executor == "slurm":  # the job writes its unit file
                    slurm = (slurm or SlurmOptions()).at(Path(os.path.abspath(out)) / "slurm")
                    worker = run_and_write
                    calls = [(*call, str(units.absolute()), None if columns is None else tuple(columns), key)
                             for call, (key, _) in zip(calls, pending)]
                for i, rows in run_each(
                    worker,
                    calls,
                    executor=executor,
                    address=address,
                    num_cpus=num_cpus,
                    num_gpus=num_gpus,
                    slurm=slurm,
                    keys=[k for k, _ in pending],
                    name=desc,
                ):
                    if executor != "slurm":
                        write_unit(units, *pending[i], rows, columns)
                    written += 1
                    bar.update()
            return collect(out, configs, columns=columns, key_defaults=key_defaults)
    except BaseException:
        if written == 0:
            remove_empty(created)
        raise


def write_unit(units: Path, key: str, config: dict[str, Any], rows: list[dict[str, Any]],
               columns: Sequence[str] | None) -> None:
    """Write a finished unit's rows, with its key and configuration, to ``units/<key>.json`` atomically."""
    _check_columns(rows, columns, config)
    text = _dumps(config)
    rows = [{**row, "unit": key, "unit_config": text} for row in rows]
    payload = {"key": key, "config": config, "rows": rows}
    write_text_atomic(units / f"{key}.json", _dumps(payload, sort_keys=False))  # keeps column order


def run_and_write(fn: UnitFn, config: dict[str, Any], root: str, units: str, columns: Sequence[str] | None,
                  key: str) -> str:
    """Run one unit and write its unit file ``key``: the body of a Slurm job (the file outlives the sweep's
    own process). Returns the unit's key."""
    rows = run_unit(fn, config, root)
    with confined(root):
        write_unit(Path(units), key, config, rows, columns)
    return key


def _check_columns(rows: list[dict[str, Any]], columns: Sequence[str] | None, config: dict[str, Any]) -> None:
    if columns is None:
        return
    extra = {c for row in rows for c in row} - set(columns) - set(PROVENANCE)
    if extra:
        raise TypeError(
            f"unit {config.get('kind') or config.get('experiment') or ''} returned columns outside its "
            f"schema: {sorted(extra)}"
        )


def collect(out: str | Path, configs: Sequence[dict[str, Any]], *, columns: Sequence[str] | None = None,
            key_defaults: KeyDefaults | None = None) -> pd.DataFrame:
    """Assemble ``results.csv`` from the finished units of ``configs``, in their order."""
    out = Path(out)
    rows: list[dict[str, Any]] = []
    for config in configs:
        rows.extend(_read_unit(out / "units" / f"{unit_key(config, key_defaults)}.json", key_defaults) or [])
    frame = pd.DataFrame(rows)
    if columns is not None:
        present = [c for c in dict.fromkeys([*columns, *PROVENANCE, *RUNNER]) if c in frame]
        frame = frame[present + [c for c in frame.columns if c not in present]]
    write_csv_atomic(_cells(frame), out / "results.csv")
    return frame
