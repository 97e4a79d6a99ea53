"""Fast batched full-rank decisions for many small matrices (k rows of width d, k <= d).

The question asked of every k x d matrix X_S (a k-subset of a pool, or one context) is whether its
smallest singular value sigma_k exceeds ``tol = rtol * sigma_max``; when it does not, its rank. The
answer must equal the float64 SVD answer at the same tolerance. With G = X_S X_S^T, sigma_k^2 =
lambda_min(G) and sigma_max^2 = lambda_max(G). Each stage decides only what it can prove.

0. float32 certificate (k-subsets of a pool, CPU; :meth:`Pool.certify32`). A shifted Cholesky
   factorisation in float32 of the subset's block of the pool Gram, the shift raised by a bound on every
   float32 rounding error (:mod:`probes.fast.errors`), so that success proves lambda_min(G) > T. It runs
   at about twice the float64 speed and reads half the memory; what it cannot prove goes on to stage 1.
0b. Dependence from the leading rows (Kruskal tests; :meth:`Pool.dependent_lead`). A dependent subset's
   factorisation fails at the first row that depends on the rows before it. Where that row is known to
   lie early (from the failing pivot of the subset's stage 0 factorisation, or, for chunks without
   stage 0, from where the shortcut settled the subsets of an earlier chunk), the float64 block of the
   leading rows alone is factorised, and the stage 1b shortcut runs on it with the whole subset's bounds:
   it proves exactly what stage 1b would prove, reading about (m / k)^2 of the block. With the
   tolerance fields, the block is factorised at the grid's lowest multiplier (the dip) first: where
   the rows are dependent up to rounding, that exposes their null vector, and so a ceiling below
   the dip, rather than a nearly dependent row before it.
1. Gram + shifted Cholesky in float64. An upper bound ``lam_hi >= lambda_max`` (min of trace,
   Gershgorin row sum and, for subsets, sigma_1^2 of the pool) gives ``tol_hi >= tol``. If the Cholesky
   factorisation of ``G - (tol_hi^2 + 2 delta) I`` succeeds, then lambda_min > tol^2: the matrix is full
   rank. ``delta`` bounds the float64 error of forming and factoring G. The margin of a certified matrix
   is a proven lower bound from the same factor L: lambda_min(G - s I) >= 1 / |L^-1|_F^2 (one batched
   triangular inverse), or the margin floor (below) when the shift was raised to it.
1b. Dependence proof (Kruskal tests, where the exact rank of a dependent subset only feeds a histogram):
   a Rayleigh quotient gives ``lam_lo <= lambda_max`` and hence ``tol_lo <= tol``; if the Cholesky
   factorisation of ``G - (tol_lo^2 - gamma) I`` fails, then lambda_min(G) < tol_lo^2 <= tol^2 (gamma:
   Demmel's bound, :func:`probes.fast.errors.dependence_slack`). Such subsets get rank -1 (unknown below
   k) and margin NaN, except the first ``exact_dependent`` of them (in subset order), whose exact ranks
   come from stages 2 and 3.
   Dip (for :mod:`probes.robust`): stage 1b tries the shift of a smaller tolerance, the robustness
   grid's lowest, first; where that factorisation fails with room to spare the matrix is exactly one
   stage 1b proves, and the grid need not prove it again there (:func:`probes.fast.stages.decide`).
   Shortcut: when a stage 1 factorisation of the same G has just failed at pivot j, the vector it
   exposes (the null vector of the first j + 1 rows, when they are dependent) often shows in O(k^2)
   that the stage 1b factorisation would fail too (:func:`probes.fast.kernels.quick_dependent`); such
   subsets get exactly the outcome stage 1b would give them, without its power iteration and
   factorisation.
1c. Tight lambda_max. A matrix neither certified nor proven dependent has its ratio in the band that
   the gap between lam_lo and lam_hi leaves around the tolerance. A dozen power steps give theta <=
   lambda_max, and a successful Cholesky factorisation of theta (1 + 1e-3) I - G proves lambda_max below
   it (:func:`tight_lambda_max`); stages 1 and 1b run again with these bounds.
2. Eigenvalues of G (``eigvalsh``) for the rest: exact ranks and margins, except where an eigenvalue
   lies within the float64 error band around tol^2.
3. float64 SVD of X_S itself for those few (and for data whose tolerance is below the Gram's resolution).

Ceilings and floors (with ``ceilings=True``, for :mod:`probes.robust`). A subset proven dependent by
the shortcut, by stage 0b or (from ``Tuning.ceil_1b_k`` on) by stage 1b proper gets a proven ceiling on
sigma_k / sigma_1 from the vector its failed factorisation exposes: |X^T v| / |v| computed from the
rows themselves (:func:`probes.fast.kernels.rows_rayleigh_up`), whose rounding is about k u |v| |x|
rather than the Gram route's (k + d) u trace(G), so an exactly dependent subset's ceiling lies near its
true ratio instead of at the Gram route's floor (which at the paper's large shapes lies above 0.1 x
rtol). Where the pool is small beside k (``Tuning.times_pool``), X^T v is one product of the whole pool
with a vector that is v on the subset's rows and exactly zero elsewhere (:meth:`Pool.times`), so no k x d
copy is gathered; the added zeros are exact, and the rounding is that of the k-term sums.
Subsets given exact spectra (stages 2 and 3) get a proven ceiling and floor from them.

Which subsets get rank -1 (and which an exact rank) depends only on the stage 1b test of each subset
(with the same bound lam_hi, bit for bit, as always), so ranks, verdicts, witnesses and rank histograms
do not depend on the chunking, on stage 0, on the shortcut, on the dip, on :mod:`probes.fast.tuning`
or on the number of threads.

Margin floor. A Kruskal test reports only the smallest margin over its subsets. The first
``Tuning.pilot`` subsets get margin bounds as in stage 1; from then on the smallest margin m found so
far (over subsets with a known rank) is a floor: stages 0 and 1 shift by ``T = tol_hi^2 10^(2 m)``
instead of tol_hi^2, and a success proves that the subset's margin is at least m, which it is credited
with. Subsets that fail at the floor go on to stage 1b, then to stage 1 at the base shift with a margin
bound of their own, and may lower the floor. Every reported margin stays a proven lower bound (or
exact). To keep the results independent of thread timing, chunk j uses the floor of the chunks up to
j - ``Tuning.lag`` (:mod:`probes.fast.planner`).

Speed. On the CPU the blocks are gathered from the pool Gram with NumPy ``take``, chunks hold
``Tuning.cache_bytes`` of float64 blocks (read as ``tuning.TUNING``, which tests may replace), and
with more than one torch thread the chunks run on up to
``Tuning.max_workers`` Python threads that share the torch threads (:mod:`probes.fast.threads`).

The names below are this package's API inside ``probes`` (:mod:`probes.robust`, :mod:`probes.kruskal`,
the streamed audit); modules and names with a leading underscore are not.
"""

from probes.fast import tuning
from probes.fast.errors import gram_error, lam_hi_bound
from probes.fast.kernels import Rows, prove_dependent, tight_lambda_max
from probes.fast.pool import Pool
from probes.fast.stages import (
    STAGE_KEYS,
    Decisions,
    chunk_size,
    decide,
    floor_certificate,
    matrix_decisions,
    new_stages,
)
from probes.fast.subsets import subset_decisions, subset_step
from probes.fast.threads import map_chunks, workers
from probes.fast.tuning import Tuning

__all__ = [
    "STAGE_KEYS", "Decisions", "Pool", "Rows", "Tuning", "chunk_size", "decide", "floor_certificate",
    "gram_error", "lam_hi_bound", "map_chunks", "matrix_decisions", "new_stages", "prove_dependent",
    "subset_decisions", "subset_step", "tight_lambda_max", "tuning", "workers",
]

