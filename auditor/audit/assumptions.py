"""The assumption tests an audit runs: one table, read by the runner, the checks and the report.

Each entry is a test as the report names it (:data:`auditor.audit.report.catalogue.TEST_SPECS`: the
``test`` column of ``results.csv`` and the ``--tests`` names, its k rule, the subset size or for
Assumption 2 the rank every context needs, and its column title in ``summary.md``) with the :mod:`probes`
function that runs it. Adding a test is one entry in the catalogue and its runner here.

The probes functions validate their inputs themselves; the audit adds only what a report needs: a
Kruskal test whose k exceeds the N examples gets a *skipped* row (one impossible test does not cost the
others), and a test that needs context matrices is refused up front when only queries are held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import probes
from auditor.audit.report.catalogue import (
    KRUSKAL_TESTS,
    QUERY_TESTS,
    TEST_SPECS,
    TEST_TITLES,
    TESTS,
    TestSpec,
)

if TYPE_CHECKING:
    import torch

__all__ = ["ASSUMPTION_TESTS", "KRUSKAL_TESTS", "QUERY_TESTS", "TESTS", "TEST_TITLES", "AssumptionTest",
           "RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """What every test of one audit shares (the fields of the audit's configuration), and which tests run."""

    subsets: int
    seed: int
    rtol: float | None
    threshold: float
    robustness: bool | str = True  # critical tolerance, tolerance grid, exact minimum margin (probes.robust;
    # "exact": without its work caps)
    tests: tuple[str, ...] = TESTS  # in the order of the rows

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments of the sampled Kruskal tests of :mod:`probes` (Assumptions 1 and 3,
        general position) that these options set."""
        return dict(subsets=self.subsets, seed=self.seed, rtol=self.rtol, threshold=self.threshold,
                    robustness=self.robustness)


# A runner takes contexts (N, n, d) or None, queries (N, d), n and the options; it returns the verdict and,
# for Assumption 2, the per-context ranks (kept for the plots).
Runner = Callable[..., "tuple[probes.AssumptionResult, probes.ContextRanks | None]"]


@dataclass(frozen=True)
class AssumptionTest(TestSpec):
    """One row of the table: the test as its rows describe it (:class:`TestSpec`: name, title, k rule,
    ``kruskal``, ``needs_contexts``) and ``run``, which calls the probes function (looked up at call time, so
    a patched ``probes`` is honoured)."""

    run: Runner


Verdict = tuple[probes.AssumptionResult, probes.ContextRanks | None]


# Assumption 2 states that every context has rank n, and every context is tested: its share needs all
# of them (1.0), whatever --threshold says of the sampled Kruskal shares, so its share meets the threshold
# exactly when its statement is proven (the streamed form, auditor.audit.stream, asks the same).
ASSUMPTION2_THRESHOLD = 1.0


def _assumption2(contexts: torch.Tensor, queries: torch.Tensor, n: int, options: RunOptions) -> Verdict:
    ranks = probes.context_ranks(contexts, rtol=options.rtol)
    return probes.assumption2(contexts, rtol=options.rtol, ranks=ranks, threshold=ASSUMPTION2_THRESHOLD,
                              robustness=options.robustness), ranks


def _assumption1(contexts: torch.Tensor | None, queries: torch.Tensor, n: int,
                 options: RunOptions) -> Verdict:
    return probes.assumption1(queries, n, **options.sampling()), None


def _assumption3(contexts: torch.Tensor, queries: torch.Tensor, n: int, options: RunOptions) -> Verdict:
    return probes.assumption3(contexts, queries, n, **options.sampling()), None


def _general_position(contexts: torch.Tensor | None, queries: torch.Tensor, n: int,
                      options: RunOptions) -> Verdict:
    return probes.general_position(queries, n=n, **options.sampling()), None


_RUNNERS: dict[str, Runner] = {"assumption2": _assumption2, "assumption1": _assumption1,
                               "assumption3": _assumption3, "general_position": _general_position}
ASSUMPTION_TESTS: dict[str, AssumptionTest] = {
    name: AssumptionTest(**{f.name: getattr(spec, f.name) for f in fields(spec)}, run=_RUNNERS[name])
    for name, spec in TEST_SPECS.items()
}
