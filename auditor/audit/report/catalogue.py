"""The assumption tests, one declaration each, and the names a report's rows use for them (``test`` column)
and for the representations (``representation`` column, parsed by :func:`block_index` alone).

A test's declaration (:class:`TestSpec`) is its one home: its name and title, its k rule, whether it is a
sampled Kruskal test and which vectors it samples, whether it needs the context matrices, its in-memory and
streamed forms (each a call of :mod:`probes`' public API) and the columns its rows fill besides the common
ones. The audit's table (:mod:`auditor.audit.assumptions`), its streamed contexts
(:mod:`auditor.audit.stream`), the rows (:mod:`auditor.audit.verdicts`), the schema (:mod:`.schema`) and the
report's tables and figures read it; adding a test is one entry in :data:`TEST_SPECS`. Nothing here imports
the audit: the report reads these names back from every CSV.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import probes

RTOL_RULE = "max(k, d) x eps of the token dtype"  # the default rtol, in words
_BLOCK = re.compile(r"block\.(-?\d+)")  # the one reader of "block.L"
_K_RULES: dict[str, Callable[[int, int, int], int]] = {  # (N, n, d) -> k
    "n": lambda num, n, d: n,
    "min(N, d)": lambda num, n, d: min(num, d),
}
# the columns a Kruskal test's row fills (probes.result_bounds) and those of a test of every context
BOUND_COLUMNS = (
    "fraction_low",
    "fraction_high",
    "krank_upper",
    "krank_lower",
    "krank_lower_method",
    "duplicates",
    "near_duplicates",
)
INTERVAL_COLUMNS = ("fraction_low", "fraction_high")
# what the streamed contexts can keep for a streamed form (auditor.audit.stream.ContextReducer): the
# per-context ranks (probes.context_ranks) and the float64 context means (probes.context_means)
REDUCTIONS = ("ranks", "means")

# A form takes contexts (N, n, d) or None (in memory) or the streamed contexts' reductions
# (auditor.audit.stream.StreamedContexts), queries (N, d), n and the audit's RunOptions; it returns the
# verdict and, for Assumption 2, the per-context ranks (kept for the plots). Each looks probes up when called.
Verdict = tuple["probes.AssumptionResult", "probes.ContextRanks | None"]
Form = Callable[[Any, Any, int, Any], Verdict]

# Assumption 2 states that every context has rank n, and every context is tested: its share needs all of
# them (1.0), whatever --threshold says of the sampled Kruskal shares, so its share meets the threshold
# exactly when its statement is proven.
ASSUMPTION2_THRESHOLD = 1.0


def _assumption2(contexts: Any, queries: Any, n: int, options: Any) -> Verdict:
    ranks = probes.context_ranks(contexts, rtol=options.rtol)
    return probes.assumption2(contexts, rtol=options.rtol, ranks=ranks, threshold=ASSUMPTION2_THRESHOLD,
                              robustness=options.robustness), ranks


def _assumption2_streamed(reduced: Any, queries: Any, n: int, options: Any) -> Verdict:
    """From the streamed ranks; the tolerance analysis reads the few contexts it needs back."""
    return probes.assumption2_from_ranks(reduced.ranks, reduced.shape, reduced.dtype, reduced.device,
                                         reduced.matrices, threshold=ASSUMPTION2_THRESHOLD,
                                         robustness=options.robustness), reduced.ranks


def _assumption1(contexts: Any, queries: Any, n: int, options: Any) -> Verdict:
    return probes.assumption1(queries, n, **options.sampling()), None


def _assumption3(contexts: Any, queries: Any, n: int, options: Any) -> Verdict:
    return probes.assumption3(contexts, queries, n, **options.sampling()), None


def _assumption3_streamed(reduced: Any, queries: Any, n: int, options: Any) -> Verdict:
    """From the streamed context means (tokens not in float64)."""
    return probes.assumption3_from_means(queries, reduced.means, n, reduced.dtype, **options.sampling()), None


def _general_position(contexts: Any, queries: Any, n: int, options: Any) -> Verdict:
    return probes.general_position(queries, n=n, **options.sampling()), None


@dataclass(frozen=True)
class TestSpec:
    """One assumption test: everything the audit and its report know of it.

    Attributes:
        name: the test's name everywhere (CLI, Python, CSV ``test`` column), also its probes function.
        title: its column in the Table-1 layout (``summary.md``, the console).
        k_rule: ``"n"`` or ``"min(N, d)"``: the subset size of a Kruskal test, or the rank each context
            must reach (Assumption 2).
        kruskal: a sampled Kruskal-rank test of k-subsets (False: every context is tested exhaustively);
            only these are skipped when N < k and reused on resume.
        needs_contexts: needs the context matrices, not only the queries.
        run: the in-memory form (contexts (N, n, d), or None for a query test).
        streamed: the form on streamed contexts (:class:`auditor.audit.stream.StreamedContexts`); None for
            a test that needs no contexts (``run`` with contexts None serves both).
        tested: the vectors a Kruskal test samples, whose certified bounds its row carries: ``"queries"``
            or ``"mixed"`` (e(t) + mean of the rows of E(t)); None for a test of every context.
        columns: the columns its rows fill besides the common ones (the schema holds them all).
        reduces: what its streamed form reads of the streamed contexts, among :data:`REDUCTIONS` (the
            contexts are reduced so only when a test asks).
    """

    __test__ = False  # not a pytest class

    name: str
    title: str
    k_rule: str
    kruskal: bool
    needs_contexts: bool
    run: Form
    streamed: Form | None
    tested: str | None
    columns: tuple[str, ...]
    reduces: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.k_rule not in _K_RULES:
            raise ValueError(f"k rule {self.k_rule!r} of {self.name} is not one of {sorted(_K_RULES)}")
        if self.needs_contexts and self.streamed is None:
            raise ValueError(f"{self.name} needs the contexts, so it needs a streamed form")
        if not set(self.reduces) <= set(REDUCTIONS) or bool(self.reduces) != (self.streamed is not None):
            raise ValueError(f"{self.name}: a streamed form reduces its contexts to some of {REDUCTIONS}; "
                             f"got {self.reduces}")
        if (self.tested is None) == self.kruskal or self.tested not in (None, "queries", "mixed"):
            raise ValueError(f"{self.name}: a Kruskal test samples 'queries' or 'mixed'; another test, None")

    def k(self, num: int, n: int, d: int) -> int:
        """k for N = ``num`` examples of n tokens of width d."""
        return _K_RULES[self.k_rule](num, n, d)


TEST_SPECS: dict[str, TestSpec] = {t.name: t for t in (
    TestSpec("assumption2", "Assumption 2 (rank n per context)", "n", kruskal=False, needs_contexts=True,
             run=_assumption2, streamed=_assumption2_streamed, tested=None, columns=INTERVAL_COLUMNS,
             reduces=("ranks",)),
    TestSpec("assumption1", "Assumption 1 (Kruskal, k = n)", "n", kruskal=True, needs_contexts=False,
             run=_assumption1, streamed=None, tested="queries", columns=BOUND_COLUMNS),
    TestSpec("assumption3", "Assumption 3 (query + mean context)", "n", kruskal=True, needs_contexts=True,
             run=_assumption3, streamed=_assumption3_streamed, tested="mixed", columns=BOUND_COLUMNS,
             reduces=("means",)),
    TestSpec("general_position", "General position (k = min(N, d))", "min(N, d)", kruskal=True,
             needs_contexts=False, run=_general_position, streamed=None, tested="queries",
             columns=BOUND_COLUMNS),
)}
TESTS = tuple(TEST_SPECS)  # the default order of an audit's rows
QUERY_TESTS = tuple(name for name, test in TEST_SPECS.items() if not test.needs_contexts)
KRUSKAL_TESTS = tuple(name for name, test in TEST_SPECS.items() if test.kruskal)  # reusable on resume
TEST_TITLES = {name: test.title for name, test in TEST_SPECS.items()}
TEST_COLUMNS = tuple(dict.fromkeys(c for test in TEST_SPECS.values() for c in test.columns))


def block_index(name: str) -> int | None:
    """L of a representation name ``block.L`` (L may be negative: counted from the last block), else None.
    The one reader of the form; :func:`block_name` writes it."""
    match = _BLOCK.fullmatch(name)
    return int(match.group(1)) if match is not None else None


def block_name(index: int) -> str:
    """The canonical name of block ``index``'s representation: ``block.L``."""
    return f"block.{index}"


def representation_depth(name: str) -> int | None:
    """Index into Hugging Face's hidden_states of a canonical representation name: 0 for ``embedding`` and
    ``random-attention`` (made from it), L + 1 for ``block.L`` (L >= 0); None for any other name."""
    if name in ("embedding", "random-attention"):
        return 0
    index = block_index(name)
    return index + 1 if index is not None and not name.startswith("block.-") else None
