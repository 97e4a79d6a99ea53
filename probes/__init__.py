"""probes: the rank tests of attention-memorization theory, as a library.

All functions take torch tensors (or NumPy arrays), run on the input's device (CPU or CUDA), do their
arithmetic in float64 and, by default, judge ranks at the tolerance of the dtype the data was produced
in (``max(m, n) * eps * sigma_max``, the rule of ``torch.linalg.matrix_rank``).

Shapes: one matrix (m, n) or a batch (..., m, n) for :func:`numerical_rank`; contexts (N, n, d) and
queries / vectors (N, d) elsewhere. Sizes and seeds may be Python or NumPy integers. Results have a
one-line ``repr`` and a ``to_dict()`` of plain typed values (:func:`flatten_row` makes CSV cells).

A caller whose contexts do not fit in memory reduces them block by block (:func:`context_ranks` on
blocks of :func:`context_block` contexts joined by :meth:`ContextRanks.concat`, :func:`context_means`,
:func:`probes.geometry.collapse_residual` on blocks of :func:`probes.geometry.residual_block`) and forms
the same results from the reductions (:func:`assumption2_from_ranks`, :func:`assumption3_from_means`);
:func:`result_bounds` adds the certified bounds to a Kruskal test's result; :func:`check_rtol` and
:func:`check_threshold` are the rules every function applies to those arguments.

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
    assumption2_from_ranks,
    assumption3,
    assumption3_from_means,
    check_threshold,
    context_block,
    context_means,
    context_ranks,
    general_position,
)
from probes.bounds import (
    DuplicateCounts,
    KruskalLowerBound,
    TestedVectors,
    clopper_pearson,
    duplicates,
    kruskal_lower_bound,
    result_bounds,
)
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
from probes.rank import RankResult, check_rtol, default_rtol, numerical_rank
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
    "TestedVectors",
    "assumption1",
    "assumption2",
    "assumption2_from_ranks",
    "assumption3",
    "assumption3_from_means",
    "check_rtol",
    "check_threshold",
    "check_witness",
    "context_block",
    "context_means",
    "context_ranks",
    "default_rtol",
    "flatten_row",
    "general_position",
    "kruskal_rank_exact",
    "kruskal_sweep",
    "kruskal_test",
    "max_subsets_in_memory",
    "numerical_rank",
    "result_bounds",
    "sample_subsets",
]
