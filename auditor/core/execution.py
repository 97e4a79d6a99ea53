"""Where work runs: in this process (``local``), as Ray tasks (``ray``) or as a Slurm job array (``slurm``),
shared by the audit and the lab.

:func:`run_each` calls a function on a list of arguments and yields ``(index, result)`` as results
arrive: in order, one after the other, for ``local``; as Ray tasks finish for ``ray`` (on a new local
instance, the one this process already joined, or the cluster at ``address``); as the tasks of one
Slurm job array finish for ``slurm`` (through submitit, :mod:`auditor.core.slurm`). A task that raises
either stops the run at once (``fail_fast``: the others are cancelled) or lets the tasks already
submitted finish first; the error raised is the task's own ``ValueError`` when that was the cause, so a
user mistake inside a worker still reads as one line. Nothing here writes files.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from auditor.core.errors import AuditError
from auditor.core.slurm import SlurmOptions, require_submitit, run_array

log = logging.getLogger(__name__)

EXECUTORS = ("local", "ray", "slurm")
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
    if executor == "slurm":
        require_submitit()


def check_resources(**amounts: float) -> None:
    """Each amount (``num_cpus=1``, ...) a finite number >= 0, else a one-line AuditError."""
    for name, value in amounts.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
            raise AuditError(f"{name} must be a finite number >= 0; got {value!r}")


RAY_CONNECT_TIMEOUT_S = (
    10.0  # how long --address may stay silent before the run is refused (Ray itself retries on)
)
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")  # + empty SETTINGS


def check_reachable(address: str | None, timeout: float | None = None) -> None:
    """A one-line AuditError unless ``host:port`` (or ``ray://host:port``) of ``address`` answers as a gRPC
    server (Ray's GCS and client server are) within ``timeout`` seconds (default
    :data:`RAY_CONNECT_TIMEOUT_S`): the HTTP/2 preface is sent and the server's SETTINGS frame awaited. Ray's
    own client retries for ever against an address that takes the connection and stays silent. None, ``auto``
    and ``local`` are Ray's discovery and are left to it."""
    if address is None or address in ("auto", "local"):
        return
    timeout = RAY_CONNECT_TIMEOUT_S if timeout is None else timeout
    client = address.startswith("ray://")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        host, port = address.removeprefix("ray://"), "10001" if client else "6379"
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_HTTP2_PREFACE)
            head = sock.recv(9)  # the first frame's header: length (3 bytes), type (0x04 = SETTINGS), ...
    except OSError as err:
        reason = f"no answer within {timeout:g} s" if isinstance(err, TimeoutError) else (
            err.strerror or type(err).__name__)
        raise AuditError(
            f"cannot reach a Ray cluster at {address!r} ({where}: {reason}); check the address, start "
            "one with 'ray start --head', or leave out --address for a local instance"
        ) from None
    if len(head) < 4 or head[3] != 0x04:
        raise AuditError(
            f"{address!r} ({where}) answers, but not as a Ray cluster (no gRPC handshake); check the "
            "address (the head's GCS port, 6379 by default, or ray://host:10001)"
        )


def connect_ray(address: str | None) -> bool:
    """Join (or start) Ray; True when this call started it (so the caller shuts it down)."""
    require_ray()
    import ray

    if ray.is_initialized():
        return False
    check_reachable(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as err:
        where = f"at {address!r}" if address else "locally"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise AuditError(f"cannot start or reach a Ray cluster {where} ({first}); start one with "
                         "'ray start --head' or leave out --address for a local instance") from None
    return True


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[Any]:
    """The ``ray`` module, joined to a cluster for the body; a cluster started here is shut down after."""
    started_here = connect_ray(address)
    import ray

    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


def user_error(err: BaseException) -> BaseException:
    """The exception to raise for a failed Ray task: the task's own ValueError (a user mistake, with its
    one-line message) when that is the cause, else the Ray error itself."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, ValueError) else err


def as_completed(task: Any, calls: Sequence[tuple], *, fail_fast: bool) -> Iterator[tuple[int, Any]]:
    """Submit ``task.remote(*args)`` for every ``args`` in ``calls`` (inside :func:`ray_session`) and
    yield ``(index, result)`` as they finish. See the module docstring for ``fail_fast``."""
    import ray

    refs = [task.remote(*args) for args in calls]
    index = {ref: i for i, ref in enumerate(refs)}
    waiting, first_error = list(refs), None
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        for ref in done:
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as err:
                if fail_fast:
                    for other in waiting:
                        ray.cancel(other)
                    raise user_error(err) from None
                if first_error is None:
                    first_error = user_error(err)  # raised once the other submitted tasks are in
                else:
                    log.warning(
                        "task %d failed too: %s", index[ref], str(user_error(err)).strip().split("\n")[0]
                    )
                continue
            yield index[ref], result
    if first_error is not None:
        raise first_error


def run_each(
    fn: Callable[..., Any],
    calls: Sequence[tuple],
    *,
    executor: str = "local",
    address: str | None = None,
    num_cpus: float = 1,
    num_gpus: float = 0,
    fail_fast: bool = False,
    slurm: SlurmOptions | None = None,
    keys: Sequence[str] | None = None,
    name: str = "run",
) -> Iterator[tuple[int, Any]]:
    """``fn(*args)`` for every ``args`` in ``calls``: yield ``(index, result)`` as each finishes.

    ``fn`` must be a module-level function (Ray and Slurm jobs import it by reference); ``num_cpus`` and
    ``num_gpus`` are what each Ray task reserves (ignored by ``local``). ``slurm`` holds the resources
    of every Slurm job and the folder of their logs (required by ``slurm``); ``keys`` (one per call)
    make the Slurm jobs resumable work and ``name`` names them (see :func:`auditor.core.slurm.run_array`).
    """
    check_executor(executor)
    check_resources(num_cpus=num_cpus, num_gpus=num_gpus)
    if executor == "slurm":
        if slurm is None:
            raise AuditError("--executor slurm needs SlurmOptions with a folder for the jobs' logs")
        yield from run_array(fn, calls, slurm, fail_fast=fail_fast, keys=keys, name=name)
        return
    if executor == "local":
        for i, args in enumerate(calls):
            yield i, fn(*args)
        return
    if not calls:
        return
    with ray_session(address) as ray:
        yield from as_completed(ray.remote(fn).options(num_cpus=num_cpus, num_gpus=num_gpus), calls,
                                fail_fast=fail_fast)
