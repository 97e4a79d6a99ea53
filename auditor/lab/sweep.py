"""Resumable sweeps: work units keyed by the hash of their configuration, rows written atomically.

A sweep is a list of *units*. A unit is a JSON-serialisable configuration dict; the function that runs
it returns one row (a dict) or a list of rows. Each finished unit's rows are written at once to
``<out>/units/<key>.json`` through a temporary file and ``os.replace``, so a killed sweep never leaves a
corrupt or partial file and never loses a finished unit. Rerunning the same sweep skips the units whose
files exist and rebuilds ``<out>/results.csv`` from all unit files in the order of the configurations,
so an interrupted-and-resumed sweep produces the same CSV as an uninterrupted one.

Executors: ``local`` (in this process, one unit after the other) and ``ray`` (each unit a Ray task, on
a local Ray instance or an existing cluster given by ``address``).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from auditor.errors import AuditError

UnitFn = Callable[[dict[str, Any]], "dict[str, Any] | list[dict[str, Any]]"]
EXECUTORS = ("local", "ray")


def unit_key(config: dict[str, Any]) -> str:
    """Stable 16-hex-digit key of a resolved configuration (order of keys does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_csv_atomic(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` to ``path`` as CSV through a temporary file (never a half-written CSV)."""
    _write_atomic(Path(path), frame.to_csv(index=False))


def _read_unit(path: Path) -> list[dict[str, Any]] | None:
    """Rows of a finished unit, or None when the file is missing or unreadable (then it is rerun)."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    rows = payload.get("rows") if isinstance(payload, dict) else None
    return rows if isinstance(rows, list) else None


def _as_rows(result: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [result] if isinstance(result, dict) else list(result)


def _check_out(out: Path) -> Path:
    out = Path(out)
    try:
        (out / "units").mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AuditError(f"cannot write to output folder {str(out)!r} ({err.strerror}); choose a writable --out") from None
    if not os.access(out / "units", os.W_OK):
        raise AuditError(f"output folder {str(out)!r} is not writable; choose a writable --out")
    return out


def run_sweep(
    fn: UnitFn,
    configs: Sequence[dict[str, Any]],
    out: str | Path,
    *,
    executor: str = "local",
    address: str | None = None,
    progress: bool = True,
    desc: str = "sweep",
) -> pd.DataFrame:
    """Run every configuration not yet finished in ``out``; return (and write) all rows.

    Args:
        fn: runs one unit; a module-level function (Ray pickles it by reference).
        configs: resolved configurations, each JSON-serialisable; the key of each row's unit is added
            as column ``unit``.
        out: folder for ``units/<key>.json`` and ``results.csv``.
        executor: ``local`` or ``ray``.
        address: Ray cluster address (``auto``, ``ray://host:10001``); None starts a local instance.
    """
    if executor not in EXECUTORS:
        raise AuditError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    out = _check_out(Path(out))
    keys = [unit_key(c) for c in configs]
    if len(set(keys)) != len(keys):
        raise AuditError("the sweep lists the same configuration twice; every unit must be distinct")
    pending = [(k, c) for k, c in zip(keys, configs) if _read_unit(out / "units" / f"{k}.json") is None]

    def finish(key: str, config: dict[str, Any], result: Any) -> None:
        rows = [{**row, "unit": key} for row in _as_rows(result)]
        _write_atomic(out / "units" / f"{key}.json", json.dumps({"config": config, "rows": rows}, default=str))

    bar = tqdm(total=len(configs), initial=len(configs) - len(pending), desc=desc, disable=not progress)
    try:
        if executor == "local":
            for key, config in pending:
                finish(key, config, fn(config))
                bar.update()
        else:
            _run_ray(fn, pending, finish, address, bar)
    finally:
        bar.close()
    return collect(out, configs)


def collect(out: str | Path, configs: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Assemble ``results.csv`` from the finished units of ``configs``, in their order."""
    out = Path(out)
    rows: list[dict[str, Any]] = []
    for config in configs:
        unit_rows = _read_unit(out / "units" / f"{unit_key(config)}.json")
        if unit_rows is not None:
            rows.extend(unit_rows)
    frame = pd.DataFrame(rows)
    write_csv_atomic(frame, out / "results.csv")
    return frame


def _run_ray(fn: UnitFn, pending, finish, address: str | None, bar) -> None:
    try:
        import ray
    except ImportError:
        raise AuditError("--executor ray needs Ray: pip install 'attention-auditor[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        remote = ray.remote(fn)
        futures = {remote.remote(config): (key, config) for key, config in pending}
        waiting = list(futures)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            for ref in done:
                key, config = futures[ref]
                finish(key, config, ray.get(ref))
                bar.update()
    finally:
        if started_here:
            ray.shutdown()
