"""Slurm through submitit: a list of calls as one job array, results gathered as the jobs finish.

:func:`run_array` is the ``slurm`` branch of :func:`auditor.core.execution.run_each`. It submits every call as
one task of one job array (submitit's ``map_array``; one call: one plain job), with the resources of
:class:`SlurmOptions`, and yields ``(index, result)`` as tasks finish. Submitit's pickles and the jobs'
logs go to ``SlurmOptions.folder`` (the sweeps use ``<out>/slurm``), which must be on a file system the
nodes share, as ``--out`` already is for the units the jobs write.

What the caller sees, and where it differs from Ray:

- a task that raises a ``ValueError`` (an ``AuditError`` included) sends that exception back: the user
  mistake reads as its own one line; any other exception is one line naming the job and its log file;
- a task that ends without a result (``scancel``, preemption, time limit, node failure) is reported as
  one line once the other tasks are in (or at once with ``fail_fast``);
- with ``keys`` (one per call: a sweep's unit keys) the jobs are resumable work: the job of every key is
  recorded in ``<folder>/jobs.json``, a rerun attaches to the jobs still queued or running instead of
  submitting them again, and jobs keep running when this process stops (Ctrl-C, logout), so nothing
  runs twice; without ``keys`` the jobs of a failed or interrupted run are cancelled;
- Slurm that cannot be reached, a bad configuration or an unknown partition is one line before anything
  is submitted; every Slurm command runs under a timeout (:data:`COMMAND_TIMEOUT_S`).

Nothing here writes outside ``folder``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pickle
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auditor.core.atomic import real_folder, write_text_atomic
from auditor.core.errors import AuditError, did_you_mean

log = logging.getLogger(__name__)

SLURM_MISSING = ('--executor slurm needs submitit, which is not installed; install it with '
                 'pip install "attention-auditor[slurm]" or use --executor local')
COMMAND_TIMEOUT_S = 30.0  # one sinfo / squeue / scancel call; a controller slower than this is unreachable
POLL_S = 0.5  # how often result files are looked for (a stat per unfinished task)
SQUEUE_EVERY_S = 5.0  # how often squeue is asked which tasks still run (the load a login node tolerates)
SQUEUE_GIVE_UP_S = 600.0  # squeue failing this long in a row: stop waiting (the jobs keep running)
DEFAULT_TIME = "60"  # minutes per job when --slurm-time is not given
MAX_PICKLE_GB = 16.0  # the calls of one array, pickled to the shared folder (shards carry their inputs)
_MANAGED = {"array", "output", "error", "job-name", "partition", "time", "cpus-per-task", "gpus-per-node",
            "gpus", "gpus-per-task", "gres", "signal", "open-mode", "wrap"}
# An extra sbatch flag is data, never shell text: each becomes one ``#SBATCH --name=value`` line of the batch
# script, so a newline would start a line of its own (a command, or a line that hides the #SBATCH lines
# after it). Names are letters, digits and dashes; values a single token of these characters (enough for
# accounts, QOS, memory, constraints such as a100&nvlink, node lists such as node[01-04], mail addresses).
_FLAG = re.compile(r"--([A-Za-z][A-Za-z0-9-]*)(?:=(.*))?", re.S)
VALUE_CHARS = "A-Za-z0-9_.,:@%+=/[]&|*~!-"
_VALUE = re.compile(r"[A-Za-z0-9_.,:@%+=/\[\]&|*~!-]+")
_PARTITION = re.compile(r"[A-Za-z0-9_.,-]+")  # a partition name, or a comma-separated list of them


def require_submitit() -> None:
    """Raise the one-line AuditError ``SLURM_MISSING`` when submitit cannot be imported."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise AuditError(SLURM_MISSING) from None


def parse_time(text: str) -> int:
    """Minutes of a Slurm time limit: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``
    (seconds round up); a one-line AuditError otherwise."""
    bad = AuditError(f"--slurm-time takes minutes or Slurm's [D-]HH:MM:SS (e.g. 90, 2:00:00, 1-12:00:00); "
                     f"got {text!r}")
    days, dash, rest = str(text).strip().rpartition("-")
    parts = rest.split(":")
    if not all(p.isdigit() for p in [*parts, *([days] if dash else [])]) or len(parts) > 3:
        raise bad
    d = int(days) if days else 0
    n = [int(p) for p in parts]
    if days:  # D-HH[:MM[:SS]]
        h, m, s = (n + [0, 0])[:3]
    elif len(n) == 3:  # HH:MM:SS
        h, m, s = n
    else:  # MM or MM:SS
        h, m, s = 0, n[0], (n + [0])[1]
    minutes = math.ceil(((d * 24 + h) * 60 + m) + s / 60)
    if minutes < 1:
        raise bad
    return minutes


def parse_sbatch(flags: Sequence[str]) -> dict[str, Any]:
    """Extra sbatch flags (``--account=abc``, ``--qos=high``, ``--exclusive``) as submitit's
    ``additional_parameters``; a one-line AuditError for a short or malformed flag or one that has its own
    option."""
    out: dict[str, Any] = {}
    for raw in flags:
        match = _FLAG.fullmatch(raw.strip()) if isinstance(raw, str) else None
        if not match:
            raise AuditError(f"--slurm-sbatch takes a long sbatch flag as --name=value or --name (e.g. "
                             f"--account=abc, --qos=high, --mem=16G, --exclusive), one token without "
                             f"spaces or newlines; got {raw!r}")
        name, value = match.group(1), match.group(2)
        if value is not None and not _VALUE.fullmatch(value):
            raise AuditError(
                f"--slurm-sbatch {raw!r}: a value is one token of the characters {VALUE_CHARS} (no spaces, "
                "quotes, newlines or shell characters; it becomes one #SBATCH line, never shell text)"
            )
        if name in _MANAGED:
            raise AuditError(
                f"--slurm-sbatch {raw!r}: --{name} is set by the executor; use --slurm-partition, "
                "--slurm-time, --slurm-cpus, --slurm-gpus or --slurm-parallel instead"
            )
        out[name] = True if value is None else value
    return out


@dataclass(frozen=True)
class SlurmOptions:
    """The resources of every job of a sweep or sharded extraction.

    partition: ``--partition`` (None: the cluster's default partition).
    time: per job, minutes or Slurm's ``[D-]HH:MM:SS``.
    cpus_per_task: CPUs per job; a job's torch uses this many threads.
    gpus_per_task: GPUs per job (``--gpus-per-node``; one task per node).
    array_parallelism: array tasks running at once (``%N``; None: as many as Slurm schedules).
    sbatch: extra long sbatch flags, ``--account=abc``, ``--qos=high``, ``--mem=16G``, ``--exclusive``.
    folder: submitit's pickles and the jobs' logs (None: the caller's default, ``<out>/slurm``).
    """

    partition: str | None = None
    time: str = DEFAULT_TIME
    cpus_per_task: int = 1
    gpus_per_task: int = 0
    array_parallelism: int | None = None
    sbatch: tuple[str, ...] = ()
    folder: str | None = None
    minutes: int = field(init=False, repr=False, compare=False)
    extra: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.partition is not None and not (isinstance(self.partition, str)
                                               and _PARTITION.fullmatch(self.partition)):
            raise AuditError(f"--slurm-partition takes a partition name (letters, digits, _ . - and commas; "
                             f"see sinfo); got {self.partition!r}")
        if self.folder is not None and (not isinstance(self.folder, str | os.PathLike) or any(
                ord(c) < 32 or ord(c) == 127 for c in str(self.folder))):
            raise AuditError(f"the Slurm log folder must be a path without control characters (newlines "
                             f"would end up in the batch script); got {self.folder!r}: choose another --out")
        for name, value, low in (
            ("--slurm-cpus", self.cpus_per_task, 1),
            ("--slurm-gpus", self.gpus_per_task, 0),
            ("--slurm-parallel", self.array_parallelism, 1),
        ):
            if value is None and name == "--slurm-parallel":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise AuditError(f"{name} takes an integer >= {low}; got {value!r}")
        object.__setattr__(
            self, "sbatch", (self.sbatch,) if isinstance(self.sbatch, str) else tuple(self.sbatch)
        )
        object.__setattr__(self, "minutes", parse_time(self.time))
        object.__setattr__(self, "extra", parse_sbatch(self.sbatch))

    def at(self, folder: str | Path) -> SlurmOptions:
        """These options with ``folder`` when none is set."""
        if self.folder is not None:
            return self
        return SlurmOptions(self.partition, self.time, self.cpus_per_task, self.gpus_per_task,
                            self.array_parallelism, self.sbatch, str(folder))

    def check_executor(self, executor: str) -> SlurmOptions:
        """These options, when ``executor`` is ``slurm`` or they are the defaults; else a one-line AuditError
        (a ``--slurm-*`` option given without ``--executor slurm`` would be silently ignored)."""
        if executor != "slurm" and self != SlurmOptions(folder=self.folder):
            raise AuditError(
                "--slurm-* options go with --executor slurm; add --executor slurm or leave them out"
            )
        return self

    def parameters(self, name: str) -> dict[str, Any]:
        """submitit's ``SlurmExecutor.update_parameters`` for jobs called ``name``."""
        params: dict[str, Any] = {
            "job_name": name,
            "time": self.minutes,
            "cpus_per_task": self.cpus_per_task,
            "additional_parameters": dict(self.extra),
            "wckey": None,
        }  # submitit's default wckey is refused where wckeys are enforced
        if self.partition:
            params["partition"] = self.partition
        if self.gpus_per_task:
            params["gpus_per_node"] = self.gpus_per_task
        if self.array_parallelism:
            params["array_parallelism"] = self.array_parallelism
        params["signal_delay_s"] = min(90, max(10, self.minutes * 60 // 10))  # USR2 before the time limit
        return params


# -- command-line options (one table for the audit and every lab command) ----------------------------

_CLI = (  # (flag, SlurmOptions field, click keyword arguments)
    ("--slurm-partition", "partition", {"default": None, "help": "Slurm partition for --executor slurm "
                                        "[default: the cluster's default partition]."}),
    ("--slurm-time", "time", {"default": DEFAULT_TIME, "show_default": True,
                              "help": "Time limit of each Slurm job: minutes or [D-]HH:MM:SS."}),
    ("--slurm-cpus", "cpus_per_task", {"type": int, "default": 1, "show_default": True,
                                       "help": "CPUs per Slurm job (its torch threads)."}),
    ("--slurm-gpus", "gpus_per_task", {"type": int, "default": 0, "show_default": True,
                                       "help": "GPUs per Slurm job."}),
    ("--slurm-parallel", "array_parallelism", {"type": int, "default": None,
                                               "help": "Array tasks running at once [default: no limit]."}),
    ("--slurm-sbatch", "sbatch", {"multiple": True, "metavar": "--FLAG[=VALUE]",
                                  "help": "Extra sbatch flag, repeatable: --slurm-sbatch=--account=abc (one "
                                          "token: letters, digits and _.,:@%+=/[]&|*~!-)."}),
)


def click_options() -> list[Any]:
    """The ``--slurm-*`` options as ``click.Option`` objects (for commands built from a list)."""
    import click

    return [click.Option([flag], **kwargs) for flag, _, kwargs in _CLI]


def with_click_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command function with the ``--slurm-*`` options."""
    import click

    for flag, _, kwargs in reversed(_CLI):
        command = click.option(flag, **kwargs)(command)
    return command


def pop_options(values: dict[str, Any]) -> SlurmOptions:
    """The ``--slurm-*`` values taken out of a click ``values`` dict, validated (one-line errors)."""
    given = {name: values.pop(flag[2:].replace("-", "_")) for flag, name, _ in _CLI}
    return SlurmOptions(**given)


# -- Slurm commands, each bounded -------------------------------------------------------------------

def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    fatal = [ln for ln in lines if "fatal" in ln.lower()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (fatal or errors or lines or [""])[0]


def slurm_command(args: Sequence[str], *, what: str) -> str:
    """stdout of a Slurm command run under :data:`COMMAND_TIMEOUT_S`; a one-line AuditError when it is
    missing, fails or does not answer (``what`` says what was being done)."""
    if shutil.which(args[0]) is None:
        raise AuditError(
            f"--executor slurm needs Slurm's commands ({args[0]} is not on PATH); run on a "
            "cluster's login node, or start a single-node Slurm with scripts/slurm-local.sh start"
        )
    try:
        done = subprocess.run(list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AuditError(
            f"Slurm did not answer {args[0]} within {COMMAND_TIMEOUT_S:g} s while {what}; check "
            "that slurmctld runs and SLURM_CONF names its config (sinfo should answer)"
        ) from None
    if done.returncode != 0:
        raise AuditError(
            f"Slurm refused {what} ({_first_line(done.stderr or done.stdout) or f'exit {done.returncode}'})"
            "; check that slurmctld runs and SLURM_CONF names its config (sinfo should answer)"
        )
    return done.stdout


def check_cluster(options: SlurmOptions) -> None:
    """Slurm answers and knows the partition; a one-line AuditError otherwise (before any submission)."""
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        raise AuditError(
            f"SLURM_CONF names {conf!r}, which is not a file; point it at the cluster's slurm.conf "
            "or unset it"
        )
    listed = slurm_command(["sinfo", "--all", "--noheader", "--format=%R"], what="listing the partitions")
    partitions = sorted({p.strip() for p in listed.split()})
    if options.partition and options.partition not in partitions:
        raise did_you_mean("Slurm partition", options.partition, partitions)


def live_tasks() -> set[str]:
    """Ids (``123_4``, ``125``) of this user's jobs that are queued or running."""
    user = pwd.getpwuid(os.getuid()).pw_name
    out = slurm_command(
        ["squeue", "--noheader", "--array", f"--user={user}", "--format=%i"], what="asking for the jobs"
    )
    return {line.strip() for line in out.splitlines() if line.strip()}


def cancel(job_ids: Sequence[str]) -> None:
    """scancel the jobs (a failure is logged, never raised: this runs while another error is on its way)."""
    if not job_ids:
        return
    try:
        slurm_command(["scancel", *job_ids], what="cancelling jobs")
    except AuditError as err:
        log.warning("could not cancel jobs %s: %s", " ".join(job_ids), err)


# -- in the job --------------------------------------------------------------------------------------

def in_job(fn: Callable[..., Any], args: tuple, threads: int) -> tuple[str, Any]:
    """Runs inside the Slurm job: ``fn(*args)`` with ``threads`` torch threads, as ``("ok", result)``, or
    ``("value-error", err)`` when it raises a ValueError
    (sent back as the exception itself when it pickles)."""
    with contextlib.suppress(ImportError):
        import torch

        torch.set_num_threads(threads)
    try:
        return "ok", fn(*args)
    except ValueError as err:
        try:
            pickle.loads(pickle.dumps(err))
        except Exception:  # an exception class that does not round-trip: keep its one line
            err = ValueError(str(err))
        return "value-error", err


# -- the driver --------------------------------------------------------------------------------------

class _Record:
    """``<folder>/jobs.json``: the job of every key submitted from this folder."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "jobs.json"
        try:
            self.jobs: dict[str, str] = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except (OSError, json.JSONDecodeError):
            log.warning("%s is unreadable; jobs of an earlier run are not attached to", self.path)
            self.jobs = {}

    def save(self) -> None:
        write_text_atomic(
            self.path, json.dumps(self.jobs, indent=0, sort_keys=True)
        )  # a link there: replaced


def _job_name(name: str) -> str:
    return "auditor-" + (re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "run")


def _submit(fn: Callable[..., Any], calls: Sequence[tuple], options: SlurmOptions, name: str) -> list[Any]:
    import submitit

    folder = Path(options.folder)
    try:
        executor = submitit.SlurmExecutor(folder=folder, max_pickle_size_gb=MAX_PICKLE_GB)
        executor.update_parameters(**options.parameters(_job_name(name)))
        return executor.map_array(
            in_job, [fn] * len(calls), list(calls), [options.cpus_per_task] * len(calls)
        )
    except (
        subprocess.SubprocessError,
        submitit.core.utils.FailedJobError,
        OSError,
        RuntimeError,
        ValueError,
    ) as err:
        raise AuditError(
            f"Slurm refused the job array ({_first_line(str(err)) or type(err).__name__}); "
            f"the sbatch script is in {folder}"
        ) from None


def _why_lost(job: Any) -> str:
    """What the job's log says about how it ended (Slurm writes ``*** JOB .. CANCELLED ..`` lines)."""
    with contextlib.suppress(OSError):
        for path in (job.paths.stderr, job.paths.stdout):
            if path.is_file():
                marks = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if "***" in ln]
                if marks:
                    return marks[-1].replace("slurmstepd: error: ", "")
    return "cancelled, preempted, timed out or its node failed"


def _outcome(job: Any) -> tuple[str, Any]:
    """("ok", result) | ("raise", exception) for a job whose result file exists."""
    import submitit

    try:
        kind, value = job.result()
    except submitit.core.utils.UncompletedJobError as err:
        return "raise", AuditError(
            f"Slurm job {job.job_id} ended without a result ({_first_line(str(err))}); "
            "finished work is kept: run the same command again to resume"
        )
    except submitit.core.utils.FailedJobError as err:
        trace = [ln for ln in str(err).splitlines() if ln.strip() and not ln.startswith(("-", " "))]
        last = next((ln for ln in reversed(trace) if "Error" in ln or "Exception" in ln), "failed")
        if "UncompletedJobError" in str(err):  # submitit's own: timed out and not requeued
            last = last.split(": ", 1)[-1]
            return "raise", AuditError(
                f"Slurm job {job.job_id} ended without a result ({last}); a longer "
                "--slurm-time may help; finished work is kept: run the same command again"
            )
        return "raise", RuntimeError(
            f"Slurm job {job.job_id} failed: {last.strip()} (log: {job.paths.stderr})"
        )
    if kind == "value-error":
        return "raise", value
    return "ok", value


def run_array(fn: Callable[..., Any], calls: Sequence[tuple], options: SlurmOptions, *, fail_fast: bool,
              keys: Sequence[str] | None = None, name: str = "run") -> Iterator[tuple[int, Any]]:
    """``fn(*args)`` for every ``args`` in ``calls`` as one Slurm job array; yield ``(index, result)`` as
    tasks finish. ``fn`` must be importable by the jobs (a module-level function). See the module docstring
    for ``fail_fast`` and ``keys``."""
    require_submitit()
    import submitit

    if options.folder is None:
        raise AuditError("SlurmOptions.folder is not set; it names where the jobs' logs go")
    if keys is not None and len(keys) != len(calls):
        raise ValueError("keys must give one key per call")
    if not calls:
        return
    check_cluster(options)
    folder = Path(options.folder)
    real_folder(folder)  # inside --out, a link planted at the log folder is replaced, never followed
    record = _Record(folder) if keys is not None else None
    jobs: dict[int, Any] = {}
    if record is not None and record.jobs:  # attach to the jobs of an earlier run that still queue or run
        live = live_tasks()
        for i, key in enumerate(keys):
            job_id = record.jobs.get(key)
            if job_id in live and (folder / f"{job_id}_submitted.pkl").is_file():
                jobs[i] = submitit.SlurmJob(folder=folder, job_id=job_id)
        if jobs:
            log.info("attached to %d Slurm jobs of an earlier run", len(jobs))
    todo = [i for i in range(len(calls)) if i not in jobs]
    if todo:
        submitted = _submit(fn, [calls[i] for i in todo], options, name)
        jobs.update(zip(todo, submitted))
        if record is not None:
            record.jobs.update({keys[i]: jobs[i].job_id for i in todo})
            record.save()
        log.info(
            "submitted %d Slurm jobs (%s) with logs in %s",
            len(todo),
            submitted[0].job_id.split("_")[0],
            folder,
        )
    yield from _gather(jobs, fail_fast=fail_fast, keep_running=keys is not None)


def _gather(jobs: dict[int, Any], *, fail_fast: bool, keep_running: bool) -> Iterator[tuple[int, Any]]:
    waiting = dict(jobs)
    first_error: BaseException | None = None
    absent: dict[int, int] = {}  # squeue calls in a row that did not list the task
    asked = failing_since = 0.0
    failed_fast = False  # a task failed under fail_fast: the rest are cancelled
    try:
        while waiting:
            for i, job in list(waiting.items()):
                if not job.paths.result_pickle.exists():
                    continue
                del waiting[i]
                kind, value = _outcome(job)
                if kind == "ok":
                    yield i, value
                    continue
                if fail_fast:
                    failed_fast = True
                    raise value
                if first_error is None:
                    first_error = value
                else:
                    log.warning("job %s failed too: %s", job.job_id, value)
            if not waiting:
                break
            if time.monotonic() - asked >= SQUEUE_EVERY_S:
                asked = time.monotonic()
                try:
                    live = live_tasks()
                    failing_since = 0.0
                except AuditError as err:
                    failing_since = failing_since or asked
                    if asked - failing_since > SQUEUE_GIVE_UP_S:
                        raise AuditError(
                            f"lost contact with Slurm for {SQUEUE_GIVE_UP_S:g} s ({err}); the jobs keep "
                            "running: run the same command again later to collect them"
                        ) from None
                    log.warning("squeue failed (%s); still waiting", err)
                    live = None
                for i, job in list(waiting.items()):
                    if live is None or job.job_id in live or job.paths.result_pickle.exists():
                        absent.pop(i, None)
                        continue
                    absent[i] = absent.get(i, 0) + 1
                    if absent[i] < 2:  # gone from squeue twice, SQUEUE_EVERY_S apart, and still no result
                        continue
                    del waiting[i]
                    lost = AuditError(
                        f"Slurm job {job.job_id} ended without a result ({_why_lost(job)}); finished "
                        "work is kept: run the same command again to resume"
                    )
                    if fail_fast:
                        failed_fast = True
                        raise lost
                    if first_error is None:
                        first_error = lost
                    else:
                        log.warning("%s", lost)
            time.sleep(POLL_S)
    except BaseException:
        if waiting and keep_running and not failed_fast:  # interrupted: resumable jobs go on
            ids = sorted({j.job_id.split("_")[0] for j in waiting.values()})
            log.warning("%d Slurm jobs keep running (%s); run the same command again to collect them, or "
                        "scancel %s", len(waiting), " ".join(ids), " ".join(ids))
        elif waiting:
            cancel([j.job_id for j in waiting.values()])
        raise
    if first_error is not None:
        raise first_error
