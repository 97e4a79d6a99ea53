"""Resumable sweeps: work units keyed by the hash of their configuration, rows written atomically.

A sweep is a list of *units*. A unit is a JSON-serialisable configuration dict; the function that runs
it returns one row (a dict) or a list of rows. Each finished unit's rows are written at once to
``<out>/units/<key>.json`` through a temporary file, ``fsync`` and ``os.replace``, so a killed sweep
never leaves a corrupt or partial unit file and never loses a finished unit. Rerunning the same sweep
skips the units whose files are complete and rebuilds ``<out>/results.csv`` from all unit files in the
order of the configurations, so an interrupted-and-resumed sweep produces the same CSV as an
uninterrupted one. A unit file that is unreadable, truncated or written for another configuration is
ignored (with a warning) and its unit is run again.

Every row carries ``unit`` (the key) and ``unit_config`` (the resolved configuration as JSON): calling
the sweep's unit function on ``json.loads(row["unit_config"])`` at the row's ``git_commit`` reproduces
the row, so each line of ``results.csv`` says how it was made.

Executors: ``local`` (in this process, one unit after the other) and ``ray`` (each unit a Ray task, on
a new local Ray instance, the one this process already joined, or the cluster at ``address``). Only
this process writes files; Ray workers return rows. One sweep at a time may write into a folder (an
advisory lock on ``<out>/units``); leftover temporary files of a killed sweep are removed on resume.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from auditor.atomic import TMP_SUFFIX, write_csv_atomic, write_text_atomic
from auditor.errors import AuditError

log = logging.getLogger(__name__)

UnitFn = Callable[[dict[str, Any]], "dict[str, Any] | list[dict[str, Any]]"]
EXECUTORS = ("local", "ray")
UNIT_FORMAT = "attention-auditor-unit/1"


def _jsonable(value: Any) -> Any:
    """JSON fallback: numpy / torch scalars as Python numbers, anything else as its string."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return value.item()
    return str(value)


def _dumps(payload: Any, *, sort_keys: bool = True) -> str:
    return json.dumps(payload, sort_keys=sort_keys, default=_jsonable, separators=(",", ":"))


LOCATION_KEYS = ("workdir",)  # say where a unit keeps side files, not what it computes: not in the key


def unit_key(config: dict[str, Any]) -> str:
    """Stable 16-hex-digit key of a resolved configuration (order of keys does not matter; the
    ``LOCATION_KEYS`` are left out, so a moved output folder still resumes)."""
    kept = {k: v for k, v in config.items() if k not in LOCATION_KEYS}
    return hashlib.sha256(_dumps(kept).encode()).hexdigest()[:16]


def _read_unit(path: Path) -> list[dict[str, Any]] | None:
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
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows) or not isinstance(config, dict):
        log.warning("unit file %s is not a complete unit record; its unit will run again", path)
        return None
    if unit_key(config) != path.stem:
        log.warning("unit file %s holds another configuration; its unit will run again", path)
        return None
    return rows


def _as_rows(result: Any, config: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [result] if isinstance(result, dict) else result
    if not isinstance(rows, list | tuple) or not all(isinstance(r, dict) for r in rows):
        raise TypeError(f"a sweep unit must return a dict or a list of dicts; got {type(result).__name__} "
                        f"for unit {config}")
    return list(rows)


def _missing_parents(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet (deepest first)."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


def _remove_empty(folders: Sequence[Path]) -> None:
    """rmdir each folder (deepest first) while it is empty; never deletes a file."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _check_out(out: Path) -> Path:
    out = Path(out)
    try:
        (out / "units").mkdir(parents=True, exist_ok=True)
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
) -> pd.DataFrame:
    """Run every configuration not yet finished in ``out``; return (and write) all rows.

    Args:
        fn: runs one unit; a module-level function (Ray ships it to the workers by reference).
        configs: resolved configurations, each JSON-serialisable and distinct; every row gets the
            columns ``unit`` (the key of its configuration) and ``unit_config`` (the configuration).
        out: folder for ``units/<key>.json`` and ``results.csv``; nothing is written elsewhere.
        executor: ``local`` or ``ray``.
        address: Ray cluster address (``auto``, ``host:port``, ``ray://host:10001``). None: the Ray
            instance this process already joined, else Ray's own discovery (``RAY_ADDRESS``, then a
            ``ray start`` cluster on this machine), else a new local instance.
        progress: show a progress bar (on a terminal only).
        num_cpus, num_gpus: resources each Ray task reserves (ignored by ``local``).

    A unit that raises stops a local sweep at once; under Ray the units already submitted still
    finish and are written, then the first error is raised. Either way finished units stay on disk,
    and a failed sweep that finished nothing leaves no folder behind.
    """
    check_executor(executor)  # before the output folder exists
    if not configs:
        raise AuditError("the sweep lists no configurations; give at least one")
    for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
            raise AuditError(f"{name} must be a finite number >= 0; got {value!r}")
    keys = [unit_key(c) for c in configs]
    if len(set(keys)) != len(keys):
        raise AuditError("the sweep lists the same configuration twice; every unit must be distinct")
    out = Path(out)
    created = _missing_parents(out / "units")
    out = _check_out(out)
    units = out / "units"
    written = 0

    def finish(key: str, config: dict[str, Any], result: Any) -> None:
        nonlocal written
        text = _dumps(config)
        rows = [{**row, "unit": key, "unit_config": text} for row in _as_rows(result, config)]
        payload = {"format": UNIT_FORMAT, "key": key, "config": config, "rows": rows}
        write_text_atomic(units / f"{key}.json", _dumps(payload, sort_keys=False))  # rows keep their column order
        written += 1

    try:
        with _exclusive(units):
            pending = [(k, c) for k, c in zip(keys, configs) if _read_unit(units / f"{k}.json") is None]
            done = len(configs) - len(pending)
            # progress on a terminal only: logs and pipes (Slurm, CI) get no carriage-return noise
            with tqdm(total=len(configs), initial=done, desc=desc, disable=None if progress else True) as bar:
                if executor == "local":
                    for key, config in pending:
                        finish(key, config, fn(config))
                        bar.update()
                else:
                    _run_ray(fn, pending, finish, address, bar, num_cpus=num_cpus, num_gpus=num_gpus)
            return collect(out, configs)
    except BaseException:
        if written == 0:
            _remove_empty(created)
        raise


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


def user_error(err: BaseException) -> BaseException:
    """The exception to raise for a failed Ray task: the task's own ValueError (a user mistake, with its
    one-line message) when that is the cause, else the Ray error itself."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, ValueError) else err


RAY_MISSING = ('--executor ray needs Ray, which is not installed; install it with '
               'pip install "attention-auditor[ray]" or use --executor local')


def require_ray() -> None:
    """Raise the one-line AuditError ``RAY_MISSING`` when Ray cannot be imported (call it before any work)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise AuditError(RAY_MISSING) from None


def check_executor(executor: str) -> None:
    """A known executor whose library is importable; else a one-line AuditError."""
    if executor not in EXECUTORS:
        raise AuditError(f"unknown executor {executor!r}; valid: {', '.join(EXECUTORS)}")
    if executor == "ray":
        require_ray()


def connect_ray(address: str | None) -> bool:
    """Join (or start) Ray; True when this call started it (so the caller shuts it down)."""
    require_ray()
    import ray

    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = f"at {address!r}" if address else "locally"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise AuditError(f"cannot start or reach a Ray cluster {where} ({first}); start one with "
                         "'ray start --head' or leave out --address for a local instance") from None
    return True


def _run_ray(fn: UnitFn, pending, finish, address: str | None, bar, *, num_cpus: float,
             num_gpus: float) -> None:
    import ray

    started_here = connect_ray(address)
    try:
        remote = ray.remote(fn).options(num_cpus=num_cpus, num_gpus=num_gpus)
        futures = {remote.remote(config): (key, config) for key, config in pending}
        waiting = list(futures)
        first_error: BaseException | None = None
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            for ref in done:
                key, config = futures[ref]
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as err:
                    if first_error is None:
                        first_error = user_error(err)  # raised once the other submitted units are in
                    else:
                        log.warning("unit %s failed too: %s", key, str(user_error(err)).strip().split("\n")[0])
                    continue
                finish(key, config, result)
                bar.update()
        if first_error is not None:
            raise first_error
    finally:
        if started_here:
            ray.shutdown()
