"""probes: the rank tests of attention-memorization theory, as a library.

All functions take torch tensors (or NumPy arrays), run on the input's device (CPU or CUDA), do their
arithmetic in float64 and, by default, judge ranks at the tolerance of the dtype the data was produced
in (``max(m, n) * eps * sigma_max``, the rule of ``torch.linalg.matrix_rank``).

Shapes: one matrix (m, n) or a batch (..., m, n) for :func:`numerical_rank`; contexts (N, n, d) and
queries / vectors (N, d) elsewhere. Sizes and seeds may be Python or NumPy integers. Results have a
one-line ``repr`` and a ``to_dict()`` of plain typed values (:func:`flatten_row` makes CSV cells).

Work is bounded: ``subsets`` per Kruskal test (default 5000) or per sweep step (default 500),
``max_seconds`` for a sweep, ``max_subsets`` for the exact search, and a memory bound on subset counts
(:func:`max_subsets_in_memory`). Long runs show a progress bar in interactive use (``progress=None``,
the default; True / False force it on or off).

>>> import torch, probes
>>> x = torch.randn(50, 16)
>>> probes.kruskal_test(x, k=16, subsets=200).fraction
1.0
>>> probes.kruskal_rank_exact(torch.cat([x[:5], x[:1]]))   # a duplicated vector
1
"""

from probes import _omp  # noqa: F401, I001 -- first: sets the OpenMP wait policy before torch loads
from probes.assumptions import (
    DEFAULT_THRESHOLD,
    AssumptionResult,
    ContextRanks,
    assumption1,
    assumption2,
    assumption3,
    context_ranks,
    general_position,
)
from probes.bounds import DuplicateCounts, KruskalLowerBound, clopper_pearson, duplicates, kruskal_lower_bound
from probes.geometry import (
    Geometry,
    anisotropy,
    collapse_residual,
    effective_rank,
    stable_rank,
    token_geometry,
)
from probes.kruskal import (
    KruskalResult,
    SweepResult,
    check_witness,
    flatten_row,
    kruskal_rank_exact,
    kruskal_sweep,
    kruskal_test,
    max_subsets_in_memory,
    sample_subsets,
)
from probes.rank import RankResult, default_rtol, numerical_rank
from probes.robust import DEFAULT_RTOL_GRID, Robustness

__all__ = [
    "DEFAULT_RTOL_GRID",
    "DEFAULT_THRESHOLD",
    "DuplicateCounts",
    "Geometry",
    "KruskalLowerBound",
    "anisotropy",
    "clopper_pearson",
    "collapse_residual",
    "duplicates",
    "effective_rank",
    "kruskal_lower_bound",
    "stable_rank",
    "token_geometry",
    "AssumptionResult",
    "ContextRanks",
    "KruskalResult",
    "RankResult",
    "Robustness",
    "SweepResult",
    "assumption1",
    "assumption2",
    "assumption3",
    "check_witness",
    "context_ranks",
    "default_rtol",
    "flatten_row",
    "general_position",
    "kruskal_rank_exact",
    "kruskal_sweep",
    "kruskal_test",
    "max_subsets_in_memory",
    "numerical_rank",
    "sample_subsets",
]
