"""The assumption tests on one representation's tokens: the rows they give and the columns the audit adds.

:func:`run_tests` runs the tests of a plan (:class:`~auditor.audit.assumptions.RunOptions`) on contexts
(N, n, d) and queries (N, d), held or streamed, and returns one typed row per test; each Kruskal row gets a
Clopper-Pearson interval of its share and bounds on the Kruskal rank of the vectors it tested
(:func:`probes.result_bounds`), and every row the token geometry of its representation
(:func:`token_geometry`).
:class:`StageClock` sums the wall time of each stage of an audit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

import probes
from auditor.audit.assumptions import ASSUMPTION_TESTS, QUERY_TESTS, RunOptions
from auditor.audit.plan import Sweep
from auditor.audit.report.catalogue import BOUND_COLUMNS
from auditor.audit.report.schema import GEOMETRY_COLUMNS, statement_of
from auditor.audit.report.tables import stage_frame
from auditor.audit.stream import StreamedContexts
from auditor.core.errors import AuditError

__all__ = [
    "BOUND_COLUMNS",
    "GEOMETRY_COLUMNS",
    "StageClock",
    "check_contexts_given",
    "curve_frame",
    "run_tests",
    "sweep_ks",
    "token_geometry",
]


class StageClock:
    """Wall time per stage of one audit (``time.perf_counter``), summed over repeats of a stage.

    Stages are named as the report shows them: ``setup``, ``extraction @ <weights>`` per weights source,
    each test by its name (summed over representations), ``sweep``, ``saving tokens``, ``reading token
    files``; :meth:`frame` adds ``other`` for the rest of the wall time since the clock was made.
    """

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as (part of) stage ``name``, also when it raises."""
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - begin)

    def frame(self) -> pd.DataFrame:
        """``stage | seconds | share`` up to now (shares of the wall time since the clock was made)."""
        return stage_frame(self.seconds, time.perf_counter() - self.start)


_ROW_FIELDS = (
    "test",
    "k",
    "N",
    "n",
    "d",
    "fraction",
    "threshold",
    "min_margin",
    "subsets",
    "exhaustive",
    "rank_counts",
    "witness",
    "rtol",
    "dtype",
    "device",
    "note",
)  # taken as probes gives them
# taken too where this version of probes gives them: how robust a verdict is to the tolerance
_TOLERANCE_FIELDS = (
    "margin_bound",
    "critical_rtol",
    "critical_rtol_low",
    "critical_rtol_high",
    "critical_rtol_exact",
    "verdict_margin",
    "rtol_grid",
    "spectrum_proof",
)


def _test_row(result: probes.AssumptionResult) -> dict[str, Any]:
    """The row of one verdict, typed (``rank_counts`` a dict, ``witness`` a list) until the CSV writer."""
    d = result.to_dict()
    return {**{key: d[key] for key in _ROW_FIELDS}, **{key: d[key] for key in _TOLERANCE_FIELDS if key in d},
            "share_meets_threshold": d["share_meets_threshold"], "status": "ok",
            "seconds": round(d["seconds"], 3)}


def token_geometry(contexts: torch.Tensor | StreamedContexts | None, queries: torch.Tensor) -> dict[str, Any]:
    """``effective_rank``, ``stable_rank``, ``anisotropy`` of the queries (N, d), raw and mean-centred
    (``*_centred``), and ``collapse_residual`` (mean over the contexts (N, n, d) of
    ||E - 1 mean(E)||_F / ||E||_F; None without contexts)."""
    if isinstance(contexts, StreamedContexts):  # the residuals were computed as the contexts streamed
        found = dataclasses.replace(probes.token_geometry(None, queries),
                                    collapse_residual=contexts.collapse_residual())
    else:
        found = probes.token_geometry(contexts, queries)
    values = {name: getattr(found, name, None) for name in GEOMETRY_COLUMNS}
    return {name: None if value is None else float(value) for name, value in values.items()}


def _mixed(contexts: torch.Tensor | StreamedContexts, queries: torch.Tensor) -> torch.Tensor:
    """The vectors Assumption 3 tests: e(t) + mean of the rows of E(t), in float64 as probes forms them."""
    if isinstance(contexts, StreamedContexts):
        return contexts.mixed(queries)  # (N, d)
    return queries.to(torch.float64) + contexts.to(torch.float64).mean(dim=1)  # (N, d)


def check_contexts_given(tests: tuple[str, ...], have_contexts: bool) -> None:
    """Without context matrices only the query tests apply; say which, before anything runs."""
    needing = [t for t in tests if ASSUMPTION_TESTS[t].needs_contexts]
    if needing and not have_contexts:
        raise AuditError(f"{needing[0]} needs the context matrices; without contexts valid tests are "
                         f"{', '.join(QUERY_TESTS)}")


def run_tests(
    contexts: torch.Tensor | StreamedContexts | None, queries: torch.Tensor, testing: RunOptions,
    bar: tqdm | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    reuse: Callable[[str], dict[str, Any] | None] | None = None,
    *, n: int | None = None, clock: StageClock | None = None, layer: str | None = None,
) -> tuple[list[dict[str, Any]], probes.ContextRanks | None]:
    """The assumption tests of ``testing.tests`` on one representation's tokens (each as its entry in
    :data:`auditor.audit.assumptions.ASSUMPTION_TESTS` says).

    Args:
        contexts: (N, n, d) and queries: (N, d), on the device the tests should run on. ``contexts`` may
            be None when only queries are held (then only Assumption 1 and general position apply), or
            streamed (:class:`auditor.audit.stream.StreamedContexts`: the same rows, from their reductions).
        on_row: called with each row as soon as its test finishes (the runner saves it to disk).
        reuse: returns the finished row of a Kruskal test from an earlier run of the same configuration
            on the same data, or None. Assumption 2 always runs (seconds; it feeds the rank histogram).
        n: the context length (default: ``contexts.shape[1]``).
        clock: adds the seconds of each test (with its row's bounds, :func:`probes.result_bounds`) to the
            stage named after it, or after it and ``layer`` (``"assumption1 (block.3)"``) when given.
    Returns:
        rows (one per test; typed values, see :mod:`auditor.audit.report.schema`) and the per-context ranks.
    """
    check_contexts_given(testing.tests, contexts is not None)
    num, d = queries.shape
    n = int(contexts.shape[1]) if n is None else n
    rows: list[dict[str, Any]] = []
    ranks = None
    shared: dict[str, probes.TestedVectors] = {}  # the bounds of vectors several tests share, by their name
    for name in testing.tests:
        test = ASSUMPTION_TESTS[name]
        stage = name if layer is None else f"{name} ({layer})"
        with clock.stage(stage) if clock is not None else contextlib.nullcontext():
            k = test.k(num, n, d)
            cached = reuse(name) if reuse is not None and test.kruskal else None
            if cached is not None and "krank_lower_method" in cached:  # a finished row, bounds included
                row = cached
            elif test.kruskal and k > num:  # a report row, not an error: the other tests still run
                row = {
                    "test": name,
                    "status": "skipped",
                    "k": k,
                    "N": num,
                    "n": n,
                    "d": d,
                    "note": f"N = {num} examples < k = {k}: too few for one {k}-subset; "
                            f"give at least {k} samples",
                }
            else:
                run_test = contexts.run if isinstance(contexts, StreamedContexts) else (
                    lambda name, *args, test=test: test.run(contexts, *args))
                result, test_ranks = run_test(name, queries, n, testing)
                ranks = test_ranks if test_ranks is not None else ranks
                row = _test_row(result)
                if not test.kruskal:  # every context tested: the share is exact, its interval a point
                    row["fraction_low"] = row["fraction_high"] = row["fraction"]
                else:  # the certified bounds at the result's own rtol
                    if test.tested not in shared:
                        tested = _mixed(contexts, queries) if test.tested == "mixed" else queries
                        shared[test.tested] = probes.TestedVectors(tested)
                    row = {**row, **probes.result_bounds(result, shared[test.tested])}
            if row.get("status") == "ok":  # the strict statement, from every bound the row now carries
                row = {**row, "statement": statement_of(row)}
        rows.append(row)
        if on_row is not None:
            on_row(row)
        if bar is not None:
            bar.update()
    return rows, ranks


def curve_frame(sweep: probes.SweepResult, model: str, rep: str, weights: str, n: int) -> pd.DataFrame:
    """The sweep's rows, typed (``rank_counts`` dicts, ``witness`` lists) until the CSV writer."""
    frame = pd.DataFrame([r.to_dict() for r in sweep.results])
    return frame.assign(
        refined=frame["k"].isin(sweep.refined),
        model=model,
        representation=rep,
        weights=weights,
        n=n,
        lower_estimate=sweep.lower_estimate,
        sampled=sweep.sampled,
        upper_bound=sweep.upper_bound,
    )


def sweep_ks(sweep: Sweep, num: int, n: int, d: int) -> list[int]:
    if sweep.ks:
        return sorted(k for k in set(sweep.ks) if k <= num)
    top = min(num, d)
    ks = sorted({*range(max(1, top // 16), top + 1, max(1, top // 16)), min(n, top), top})
    return [k for k in ks if k <= num]
