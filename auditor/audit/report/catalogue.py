"""What a report's rows name: the assumption tests (``test`` column) and the representations
(``representation`` column), and the rule of the default rank tolerance.

The report owns these because it reads them back from every CSV; the audit attaches a :mod:`probes`
function to each test (:mod:`auditor.audit.assumptions`) and runs them. Nothing here imports the audit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

RTOL_RULE = "max(k, d) x eps of the token dtype"  # the default rtol, in words
_CANONICAL_BLOCK = re.compile(r"block\.(\d+)")
_K_RULES: dict[str, Callable[[int, int, int], int]] = {  # (N, n, d) -> k
    "n": lambda num, n, d: n,
    "min(N, d)": lambda num, n, d: min(num, d),
}


@dataclass(frozen=True)
class TestSpec:
    """One assumption test as its rows describe it.

    Attributes:
        name: the test's name everywhere (CLI, Python, CSV ``test`` column), also its probes function.
        title: its column in the Table-1 layout (``summary.md``, the console).
        k_rule: ``"n"`` or ``"min(N, d)"``: the subset size of a Kruskal test, or the rank each context
            must reach (Assumption 2).
        kruskal: a sampled Kruskal-rank test of k-subsets (False: every context is tested exhaustively);
            only these are skipped when N < k and reused on resume.
        needs_contexts: needs the context matrices, not only the queries.
    """

    name: str
    title: str
    k_rule: str
    kruskal: bool
    needs_contexts: bool

    def __post_init__(self) -> None:
        if self.k_rule not in _K_RULES:
            raise ValueError(f"k rule {self.k_rule!r} of {self.name} is not one of {sorted(_K_RULES)}")

    def k(self, num: int, n: int, d: int) -> int:
        """k for N = ``num`` examples of n tokens of width d."""
        return _K_RULES[self.k_rule](num, n, d)


TEST_SPECS: dict[str, TestSpec] = {t.name: t for t in (
    TestSpec("assumption2", "Assumption 2 (rank n per context)", "n", kruskal=False, needs_contexts=True),
    TestSpec("assumption1", "Assumption 1 (Kruskal, k = n)", "n", kruskal=True, needs_contexts=False),
    TestSpec("assumption3", "Assumption 3 (query + mean context)", "n", kruskal=True, needs_contexts=True),
    TestSpec("general_position", "General position (k = min(N, d))", "min(N, d)", kruskal=True,
             needs_contexts=False),
)}
TESTS = tuple(TEST_SPECS)  # the default order of an audit's rows
QUERY_TESTS = tuple(name for name, test in TEST_SPECS.items() if not test.needs_contexts)
KRUSKAL_TESTS = tuple(name for name, test in TEST_SPECS.items() if test.kruskal)  # reusable on resume
TEST_TITLES = {name: test.title for name, test in TEST_SPECS.items()}


def representation_depth(name: str) -> int | None:
    """Index into Hugging Face's hidden_states of a canonical representation name: 0 for ``embedding`` and
    ``random-attention`` (made from it), L + 1 for ``block.L`` (L >= 0); None for any other name."""
    if name in ("embedding", "random-attention"):
        return 0
    match = _CANONICAL_BLOCK.fullmatch(name)
    return int(match.group(1)) + 1 if match is not None else None
