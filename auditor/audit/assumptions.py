"""The assumption tests an audit runs: one table, read by the runner, the checks and the report.

Each entry names a test (the ``test`` column of ``results.csv`` and the ``--tests`` names), the
:mod:`probes` function that runs it, its k rule (the subset size, or for Assumption 2 the rank every
context needs) and its column title in ``summary.md``. Adding a test is one entry here.

The probes functions validate their inputs themselves; the audit adds only what a report needs: a
Kruskal test whose k exceeds the N examples gets a *skipped* row (one impossible test does not cost the
others), and a test that needs context matrices is refused up front when only queries are held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import probes

_K_RULES: dict[str, Callable[[int, int, int], int]] = {  # (N, n, d) -> k
    "n": lambda num, n, d: n,
    "min(N, d)": lambda num, n, d: min(num, d),
}


@dataclass(frozen=True)
class RunOptions:
    """What every test of one audit shares (the fields of the audit's configuration)."""

    subsets: int
    seed: int
    rtol: float | None
    threshold: float
    robustness: bool = True  # critical tolerance, tolerance grid and exact minimum margin (probes.robust)


# A runner takes contexts (N, n, d) or None, queries (N, d), n and the options; it returns the verdict and,
# for Assumption 2, the per-context ranks (kept for the plots).
Runner = Callable[..., "tuple[probes.AssumptionResult, probes.ContextRanks | None]"]


@dataclass(frozen=True)
class AssumptionTest:
    """One row of the table.

    Attributes:
        name: the test's name everywhere (CLI, Python, CSV ``test`` column), also its probes function.
        title: its column in the Table-1 layout (``summary.md``, the console).
        k_rule: ``"n"`` or ``"min(N, d)"``: the subset size of a Kruskal test, or the rank each context
            must reach (Assumption 2).
        kruskal: a sampled Kruskal-rank test of k-subsets (False: every context is tested exhaustively);
            only these are skipped when N < k and reused on resume.
        needs_contexts: needs the context matrices, not only the queries.
        run: calls the probes function (looked up at call time, so a patched ``probes`` is honoured).
    """

    name: str
    title: str
    k_rule: str
    kruskal: bool
    needs_contexts: bool
    run: Runner

    def __post_init__(self) -> None:
        if self.k_rule not in _K_RULES:
            raise ValueError(f"k rule {self.k_rule!r} of {self.name} is not one of {sorted(_K_RULES)}")

    def k(self, num: int, n: int, d: int) -> int:
        """k for N = ``num`` examples of n tokens of width d."""
        return _K_RULES[self.k_rule](num, n, d)


def _assumption2(contexts, queries, n, options: RunOptions):
    ranks = probes.context_ranks(contexts, rtol=options.rtol)
    return probes.assumption2(contexts, rtol=options.rtol, ranks=ranks, robustness=options.robustness), ranks


def _assumption1(contexts, queries, n, options: RunOptions):
    return probes.assumption1(queries, n, subsets=options.subsets, seed=options.seed, rtol=options.rtol,
                              threshold=options.threshold, robustness=options.robustness), None


def _assumption3(contexts, queries, n, options: RunOptions):
    return probes.assumption3(contexts, queries, n, subsets=options.subsets, seed=options.seed, rtol=options.rtol,
                              threshold=options.threshold, robustness=options.robustness), None


def _general_position(contexts, queries, n, options: RunOptions):
    return probes.general_position(queries, n=n, subsets=options.subsets, seed=options.seed, rtol=options.rtol,
                                   threshold=options.threshold, robustness=options.robustness), None


ASSUMPTION_TESTS: dict[str, AssumptionTest] = {t.name: t for t in (
    AssumptionTest("assumption2", "Assumption 2 (rank n per context)", "n", kruskal=False, needs_contexts=True,
                   run=_assumption2),
    AssumptionTest("assumption1", "Assumption 1 (Kruskal, k = n)", "n", kruskal=True, needs_contexts=False,
                   run=_assumption1),
    AssumptionTest("assumption3", "Assumption 3 (query + mean context)", "n", kruskal=True, needs_contexts=True,
                   run=_assumption3),
    AssumptionTest("general_position", "General position (k = min(N, d))", "min(N, d)", kruskal=True,
                   needs_contexts=False, run=_general_position),
)}
TESTS = tuple(ASSUMPTION_TESTS)  # the default order of an audit's rows
QUERY_TESTS = tuple(name for name, test in ASSUMPTION_TESTS.items() if not test.needs_contexts)
KRUSKAL_TESTS = tuple(name for name, test in ASSUMPTION_TESTS.items() if test.kruskal)  # reusable on resume
TEST_TITLES = {name: test.title for name, test in ASSUMPTION_TESTS.items()}
