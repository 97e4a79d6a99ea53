"""Chunks of work on Python threads that share torch's threads, with results in a fixed order."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import threadpoolctl
import torch

from probes.fast import tuning


def run_chunks(bounds: list[tuple[int, int]], done: list, work: Callable, plan_of: Callable, workers: int,
               on_chunk: Callable[[int], None] | None, lag: int) -> None:
    """Run ``work(j, plan_of(j, done))`` for the chunks after the first ``len(done)`` (already done)
    on ``workers`` threads with one torch thread each (restored afterwards; NumPy's BLAS too, see
    :func:`_blas_threads`), into ``done``. Chunk j
    starts once every chunk <= j - ``lag`` is done, so its plan never depends on timing. Progress is
    reported from the calling thread."""
    n = len(bounds)
    start = len(done)
    done.extend([None] * (n - start))
    state = {"next": start, "prefix": start, "error": None, "stop": False}
    cond = threading.Condition()
    threads_before = torch.get_num_threads()
    per_worker = max(1, threads_before // workers)

    def prefix() -> int:
        while state["prefix"] < n and done[state["prefix"]] is not None:
            state["prefix"] += 1
        return state["prefix"]

    def worker() -> None:
        torch.set_num_threads(per_worker)
        while True:
            with cond:
                j = state["next"]
                if j >= n or state["error"] is not None or state["stop"]:
                    return
                state["next"] += 1
                cond.wait_for(lambda j=j: state["error"] is not None or state["stop"] or prefix() > j - lag)
                if state["error"] is not None or state["stop"]:
                    return
                plan = plan_of(j, done)
            try:
                result = work(j, plan)
            except Exception as exc:  # noqa: BLE001 -- re-raised in the calling thread
                with cond:
                    state["error"] = exc
                    cond.notify_all()
                return
            with cond:
                done[j] = result
                cond.notify_all()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    with _blas_threads(per_worker):  # (set and restored in this thread)
        try:
            for t in threads:
                t.start()
            reported = start
            with cond:
                while True:
                    cond.wait_for(lambda r=reported: state["error"] is not None or prefix() > r)
                    if state["error"] is not None:
                        break
                    top = prefix()
                    if on_chunk is not None:
                        cond.release()
                        try:
                            on_chunk(int(bounds[top - 1][1] - bounds[reported][0]))
                        finally:
                            cond.acquire()
                    reported = top
                    if reported >= n:
                        break
            for t in threads:
                t.join()
        finally:
            with cond:  # on an interrupt, the workers finish their chunk and stop
                state["stop"] = True
                cond.notify_all()
            torch.set_num_threads(threads_before)
    if state["error"] is not None:
        raise state["error"]


def map_chunks(work: Callable[[int], Any], count: int, workers: int) -> list:
    """[work(0), ..., work(count - 1)], on ``workers`` threads with one torch thread each (in the
    calling thread when that is 1 or there is a single item); the order of the results is fixed."""
    if min(workers, count) <= 1:
        return [work(j) for j in range(count)]
    out: list = []
    run_chunks([(j, j + 1) for j in range(count)], out, lambda j, _plan: work(j), lambda j, done: None,
                min(workers, count), None, lag=count)
    return out


def workers() -> int:
    """Worker threads for independent chunks on the CPU: ``Tuning.max_workers``, at most torch's threads."""
    return min(tuning.TUNING.max_workers, torch.get_num_threads())


def spread(fn: Callable[[torch.Tensor], torch.Tensor], batch: torch.Tensor) -> torch.Tensor:
    """``fn(batch)`` for a batched LAPACK routine on small matrices (``eigvalsh``, ``svdvals`` at k of a
    few hundred), computed in pieces on the calling thread's torch threads, one torch thread each, on
    the CPU. torch would solve the matrices one after another with every thread inside LAPACK, whose
    many small parallel regions (about one per column of the reduction) each wait for sleeping threads
    under the passive OpenMP wait policy that :mod:`probes` sets: at k = 197, 110 eigenvalue problems
    took 1.1 s that way against 0.09 s with spinning threads (2 cores). Inside a worker (one torch
    thread) it is ``fn(batch)``."""
    n = batch.shape[0]
    pieces = min(workers(), n)
    if batch.device.type != "cpu" or pieces <= 1:
        return fn(batch)
    cuts = [n * j // pieces for j in range(pieces + 1)]
    return torch.cat(map_chunks(lambda j: fn(batch[cuts[j] : cuts[j + 1]]), pieces, pieces))


@functools.cache
def _controller() -> threadpoolctl.ThreadpoolController:
    """The process's BLAS and OpenMP libraries as threadpoolctl finds them (once: it reads every loaded
    library)."""
    return threadpoolctl.ThreadpoolController()


@contextlib.contextmanager
def _blas_threads(count: int) -> Iterator[None]:
    """NumPy's BLAS (OpenBLAS in its wheels, found by threadpoolctl) on ``count`` threads while the
    worker threads of :func:`run_chunks` run, set and restored from the calling thread: its thread
    pool is process-wide, and a BLAS that starts threads of its own inside each worker oversubscribes
    the cores (eight eigenvalue problems at k = 768 on two workers: 244 ms with two BLAS threads
    each, 119 ms with one). threadpoolctl lets one thread at a time set a process-wide pool: from a
    worker, while the calling thread holds it, this sets and restores nothing."""
    limiter = _controller().limit(limits=count, user_api="blas")
    try:
        yield
    finally:
        limiter.restore_original_limits()


def eigvalsh(gram: torch.Tensor) -> torch.Tensor:
    """Ascending eigenvalues of a batch of symmetric matrices (t, k, k) (the lower triangle is read), as
    ``torch.linalg.eigvalsh``. On the CPU in float64 (``Tuning.eigen_numpy``) by NumPy's LAPACK (the
    fast path runs it on its worker threads with one BLAS thread each, see :func:`spread` and
    :func:`run_chunks`; NumPy releases the GIL): on the 2-core AMD EPYC machine of the benchmarks it
    took 10.9 / 28.3 / 64.2 ms a matrix at k = 512 / 768 / 1024 against torch's 16.3 / 48.1 / 106.5
    (MKL; one thread each; 1.15 against 1.28 ms at k = 197). Both are the same LAPACK algorithm
    (divide and conquer), backward stable: the proven error bands of the stages that use them hold for
    either."""
    if (gram.device.type != "cpu" or gram.dtype != torch.float64 or not tuning.TUNING.eigen_numpy
            or gram.requires_grad):
        return torch.linalg.eigvalsh(gram)
    # (as many BLAS threads as torch has here: one inside a worker, the user's count outside, e.g.
    # ``audit --threads 1``; inside :func:`run_chunks` the calling thread has set it already)
    with _blas_threads(torch.get_num_threads()):
        return torch.from_numpy(np.linalg.eigvalsh(gram.numpy()))
