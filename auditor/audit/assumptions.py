"""The assumption tests an audit runs, and the options they share.

Each test is declared once, in :data:`auditor.audit.report.catalogue.TEST_SPECS` (its name, title, k rule,
in-memory and streamed forms, the vectors it samples and its columns); :data:`ASSUMPTION_TESTS` is that
table as the audit reads it, and :class:`RunOptions` what every test of one audit shares.

The probes functions validate their inputs themselves; the audit adds only what a report needs: a
Kruskal test whose k exceeds the N examples gets a *skipped* row (one impossible test does not cost the
others), and a test that needs context matrices is refused up front when only queries are held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from auditor.audit.report.catalogue import (
    ASSUMPTION2_THRESHOLD,
    KRUSKAL_TESTS,
    QUERY_TESTS,
    TEST_SPECS,
    TEST_TITLES,
    TESTS,
    TestSpec,
)

__all__ = ["ASSUMPTION2_THRESHOLD", "ASSUMPTION_TESTS", "KRUSKAL_TESTS", "QUERY_TESTS", "TESTS",
           "TEST_TITLES", "RunOptions"]


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


ASSUMPTION_TESTS: dict[str, TestSpec] = TEST_SPECS
