"""The input assumptions of attention-memorization theory as tests on token tensors.

- Assumption 1: the N query vectors have Kruskal rank >= n (tested at k = n).
- Assumption 2: every context matrix E(t) (n x d) has rank n.
- Assumption 3: the vectors e(t) + mean of the rows of E(t) have Kruskal rank >= n.
- General position: the vectors have Kruskal rank min(N, d).

Each result says two things, in this order. Its ``statement`` is what the test decides about the
assumption itself (Kruskal rank >= k, every context of rank n): ``refuted`` by a witness, ``proven``
where every subset was enumerated full rank, or ``not decided`` (sampling cannot prove a Kruskal rank;
:func:`probes.kruskal_lower_bound` can). Its ``share_meets_threshold`` compares the measured share of
full-rank k-subsets (for Assumption 2: of rank-n contexts) with ``threshold``, by default
:data:`DEFAULT_THRESHOLD` = 0.99 for every test: a share can meet its threshold while a witness refutes
the statement.

Calling convention, the same as :func:`probes.kruskal_test`: the data, the test's sizes, then
``subsets``, ``seed`` and ``rtol`` may be given by position (where the test has them); every other
option by keyword only.

The Kruskal tests take the bounds and the ``progress`` option of :func:`probes.kruskal_test`:
``subsets`` (default 5000, as ``audit --subsets``) and a bar for large tests in interactive use.
"""

from __future__ import annotations

import dataclasses
import numbers
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from probes import fast, robust
from probes.kruskal import (
    KruskalResult,
    _fmt_critical,
    _fmt_scope,
    _fmt_witness,
    checked_kruskal,
    result_dict,
    validate_vectors,
)
from probes.rank import (
    Array,
    abs_max,
    as_tensor,
    check_finite,
    check_int,
    check_lossless,
    ldexp2,
    pow2_exponent,
    pow2_rescale,
    resolve_rtol,
)

DEFAULT_THRESHOLD = 0.99


@dataclass(frozen=True)
class ContextRanks:
    """Per-context ranks (Assumption 2).

    Attributes:
        rank: (N,) int64 rank of each context.
        margin: (N,) float64 margins in decades (certified lower bounds where ``bound``).
        n, d: context length and width; ``rtol``: tolerance used.
        bound: (N,) bool, True where the margin is a certified lower bound rather than exact.
    """

    rank: torch.Tensor
    margin: torch.Tensor
    n: int
    d: int
    rtol: float
    stages: dict[str, int] = field(default_factory=dict)
    bound: torch.Tensor | None = None

    @classmethod
    def concat(cls, parts: list[ContextRanks]) -> ContextRanks:
        """The ranks of consecutive blocks of the same N contexts (same n, d, rtol), joined in order: what
        one :func:`context_ranks` call on all of them gives when each part covers the blocks it cuts
        (:func:`context_block`)."""
        first = parts[0]
        return dataclasses.replace(
            first,
            rank=torch.cat([p.rank for p in parts]),
            margin=torch.cat([p.margin for p in parts]),
            stages={key: sum(p.stages[key] for p in parts) for key in first.stages},
            bound=None if first.bound is None else torch.cat([p.bound for p in parts]),
        )


def context_block(n: int, d: int) -> int:
    """How many (n, d) contexts :func:`context_ranks` decides at once: a caller that reduces its contexts
    chunk by chunk feeds it whole blocks of this many to get the ranks of one call on all of them."""
    k, width = (n, d) if n <= d else (d, n)  # context_ranks decides the smaller problem
    return fast.chunk_size(k, width)


def context_means(contexts: torch.Tensor) -> torch.Tensor:
    """(N, d) float64 means of the rows of each context (N, n, d), as Assumption 3 forms them (on the
    contexts' device; the contexts must not be float64, whose Assumption 3 shares one scale with the
    queries, see :func:`assumption3`)."""
    return contexts.to(torch.float64).mean(dim=1)


def check_contexts(contexts: Array) -> torch.Tensor:
    """The contexts as a non-empty finite (N, n, d) tensor, or ValueError."""
    e = as_tensor(contexts, "contexts")
    if e.ndim != 3:
        raise ValueError(f"contexts must have shape (N, n, d); got shape {tuple(e.shape)}")
    if 0 in e.shape:
        raise ValueError(f"contexts must be non-empty (N, n, d >= 1); got shape {tuple(e.shape)}")
    check_finite(e, "contexts")
    return e


def context_ranks(contexts: Array, rtol: float | None = None) -> ContextRanks:
    """Numerical rank of every context matrix.

    Args:
        contexts: (N, n, d) the n context tokens of each of N examples, any device.
        rtol: relative tolerance; default ``max(n, d) * eps`` of the contexts' dtype.

    Returns:
        :class:`ContextRanks` with ranks (N,) and margins (N,).
    """
    e = check_contexts(contexts)
    _, n, d = e.shape
    rtol = resolve_rtol(rtol, n, d, e.dtype)
    e, _ = pow2_rescale(e, (1, 2))  # exact powers of two per context where float64 would under/overflow
    # for n > d the rank is at most d and the transposed (d, n) problem is the small one
    dec = fast.matrix_decisions(e if n <= d else e.transpose(1, 2), rtol)
    return ContextRanks(
        rank=dec.rank, margin=dec.margin, n=n, d=d, rtol=rtol, stages=dec.stages, bound=dec.bound
    )


@dataclass(frozen=True, repr=False)
class AssumptionResult:
    """Verdict of one assumption test; ``to_dict()`` is a report row.

    Attributes:
        test: ``assumption1`` | ``assumption2`` | ``assumption3`` | ``general_position``.
        share_meets_threshold: ``fraction >= threshold`` (and the test was possible at all): a statement
            about the measured share only. Whether the assumption itself is refuted, proven or not
            decided by this test is :attr:`statement`.
        fraction: share of full-rank subsets (or, for Assumption 2, of rank-n contexts).
        k: subset size tested (Assumption 2: the rank required, n).
        N, n, d: number of examples, context length (None when not given), width.
        threshold: the share required for ``share_meets_threshold``.
        rtol: relative tolerance (a singular value counts when it exceeds rtol x sigma_max of its matrix).
        min_margin: smallest margin in decades over the subsets (contexts) with a known rank: for a
            full-rank one log10(sigma_k / (rtol sigma_1)), for a dependent one the distance from the
            threshold to the nearer of sigma_r and sigma_{r+1}. Exact (float64 singular values) unless
            ``margin_bound``.
        robustness: how the verdict depends on the tolerance (:class:`probes.robust.Robustness`:
            ``margin_bound`` (also without robustness: then True wherever a bound sets ``min_margin``),
            ``critical_rtol``, the ``ceil(threshold x subsets)``-th largest sigma_k / sigma_1 over the
            subsets (for Assumption 2 at threshold 1, the smallest sigma_n / sigma_1 over the contexts),
            with its proven bracket, ``verdict_margin``, ``rtol_grid``).
        subsets: subsets (or contexts) tested; ``exhaustive``: every subset (context) was enumerated and
            tested; ``spectrum_proof``: every subset is proven dependent at once by the pool's spectrum
            (only a sample was decomposed, for the rank histogram; see ``note``).
        witness: indices of a dependent subset (or of a rank-deficient context), or None.
        rank_counts: histogram {rank: count}.
        dtype, device, seed, seconds; note: why a verdict is trivial.
    """

    test: str
    share_meets_threshold: bool
    fraction: float
    k: int
    N: int
    n: int | None
    d: int
    threshold: float
    rtol: float
    min_margin: float
    subsets: int
    exhaustive: bool
    witness: tuple[int, ...] | None
    rank_counts: dict[int, int]
    dtype: str
    device: str
    seed: int | None
    seconds: float
    stages: dict[str, int] = field(default_factory=dict)
    note: str = ""
    robustness: robust.Robustness = field(default_factory=robust.Robustness)
    spectrum_proof: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Flat dict of typed values for a report row: ints (k, N, n, d, subsets, seed; n and seed may
        be None), bools (share_meets_threshold, exhaustive, spectrum_proof, margin_bound; critical_rtol_exact,
        None without robustness), floats (fraction, threshold, rtol,
        min_margin, seconds, critical_rtol, critical_rtol_low, critical_rtol_high, verdict_margin),
        ``rank_counts`` dict[int, int], ``witness`` list[int] or None, ``stages`` dict[str, int],
        ``rtol_grid`` dict[float, float] or None. :func:`probes.flatten_row` turns it into CSV cells."""
        return result_dict(self)

    @property
    def statement(self) -> str:
        """What this test decides about the assumption itself (for Assumptions 1 and 3 and general
        position: Kruskal rank >= k; for Assumption 2: every context has rank n), never from the share
        alone: ``"refuted"`` where a dependent subset (rank-deficient context) was found (``witness``) or
        the pool's spectrum proves every subset dependent; ``"proven"`` where every subset (context) was
        enumerated and found full rank; ``"not decided"`` otherwise (sampling that finds no dependent
        subset cannot prove there is none; the certified lower bound of
        :func:`probes.kruskal_lower_bound` can)."""
        if self.witness is not None or self.spectrum_proof:
            return "refuted"
        if self.exhaustive and self.subsets > 0 and self.fraction == 1.0 and not self.note:
            return "proven"
        return "not decided"

    def __repr__(self) -> str:
        share = "meets" if self.share_meets_threshold else "below"
        if self.test == "assumption2":
            scope = f"of {self.subsets} contexts with rank n={self.k}"
        else:
            scope = f"{_fmt_scope(self.subsets, self.exhaustive, self.spectrum_proof)} at k={self.k}"
        text = (f"AssumptionResult({self.test}: {self.statement}; fraction={self.fraction:.4f} {scope}, "
                f"{share} threshold {self.threshold:g}, N={self.N}, d={self.d}, "
                f"min_margin={self.min_margin:.2f} decades{_fmt_critical(self)}{_fmt_witness(self.witness)}")
        return text + (f"; {self.note}" if self.note else "") + ")"


def check_threshold(threshold: Any) -> float:
    """Validate an assumption test's ``threshold``: a number in (0, 1], as a float."""
    if (isinstance(threshold, bool | np.bool_) or not isinstance(threshold, numbers.Real)
            or not 0 < threshold <= 1):
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
    return float(threshold)


def check_n(n: Any) -> int:
    """Validate a context length n (a positive integer)."""
    return check_int(n, "n (the context length)")


def from_kruskal(test: str, res: KruskalResult, threshold: float, n: int | None) -> AssumptionResult:
    """The verdict of assumption test ``test`` from its Kruskal test ``res`` at ``threshold`` (checked)."""
    possible = res.k <= res.d  # k > d: no k vectors in R^d are independent
    return AssumptionResult(
        test=test, share_meets_threshold=possible and res.fraction >= threshold, fraction=res.fraction,
        k=res.k, N=res.N,
        n=n, d=res.d, threshold=threshold, rtol=res.rtol, min_margin=res.min_margin, subsets=res.subsets,
        exhaustive=res.exhaustive, witness=res.witness, rank_counts=res.rank_counts, dtype=res.dtype,
        device=res.device, seed=res.seed, seconds=res.seconds, stages=res.stages, note=res.note,
        robustness=res.robustness, spectrum_proof=res.spectrum_proof,
    )


def assumption1(
    queries: Array, n: int, subsets: int = 5000, seed: int = 0, rtol: float | None = None, *,
    threshold: float = DEFAULT_THRESHOLD, progress: bool | None = None,
    robustness: bool | str = True, rtol_grid: tuple[float, ...] | None = robust.DEFAULT_RTOL_GRID,
) -> AssumptionResult:
    """Assumption 1: the query set has Kruskal rank >= n (sampled at k = n).

    Args:
        queries: (N, d) one query vector per example.
        n: context length; the subset size tested. Needs n <= N (else ValueError).
        subsets, seed, rtol, progress, robustness, rtol_grid: as in :func:`probes.kruskal_test`; the
            critical tolerance refers to this test's ``threshold``.
    """
    n = check_n(n)
    threshold = check_threshold(threshold)
    res = checked_kruskal(queries, n, subsets, seed, rtol, rank_sample=100, progress=progress,
                          robustness=robustness, rtol_grid=rtol_grid, threshold=threshold)
    return from_kruskal("assumption1", res, threshold, n)


def assumption3(
    contexts: Array, queries: Array, n: int | None = None, subsets: int = 5000, seed: int = 0,
    rtol: float | None = None, *, threshold: float = DEFAULT_THRESHOLD, progress: bool | None = None,
    robustness: bool | str = True, rtol_grid: tuple[float, ...] | None = robust.DEFAULT_RTOL_GRID,
) -> AssumptionResult:
    """Assumption 3: the vectors e(t) + mean_i E(t)_i have Kruskal rank >= n.

    Args:
        contexts: (N, n, d); queries: (N, d); n: subset size (default: the contexts' n).
        subsets, seed, rtol, progress, robustness, rtol_grid: as in :func:`probes.kruskal_test`; the
            critical tolerance refers to this test's ``threshold``.
    """
    e = check_contexts(contexts)
    q = validate_vectors(queries, "queries")
    if q.shape[0] != e.shape[0] or q.shape[1] != e.shape[2]:
        raise ValueError(
            f"queries {tuple(q.shape)} do not match contexts {tuple(e.shape)}; expected queries (N, d) = "
            f"({e.shape[0]}, {e.shape[2]})"
        )
    n = e.shape[1] if n is None else check_n(n)
    threshold = check_threshold(threshold)
    q64, e64 = q.to(torch.float64), e.to(torch.float64)
    if torch.float64 in (q.dtype, e.dtype):  # one exact power of two for both, where float64 would overflow
        exp = pow2_exponent(torch.maximum(abs_max(q), abs_max(e)))
        if exp is not None:
            scaled_q, scaled_e = ldexp2(q64, -exp), ldexp2(e64, -exp)
            check_lossless(q64, scaled_q, exp)
            check_lossless(e64, scaled_e, exp)
            q64, e64 = scaled_q, scaled_e
    mixed = q64 + e64.mean(dim=1)  # (N, d)
    return _assumption3_of(mixed, n, e.dtype, subsets, seed, rtol, threshold=threshold, progress=progress,
                           robustness=robustness, rtol_grid=rtol_grid)


def assumption3_from_means(
    queries: Array, means: torch.Tensor, n: int, dtype: torch.dtype, subsets: int = 5000, seed: int = 0,
    rtol: float | None = None, *, threshold: float = DEFAULT_THRESHOLD, progress: bool | None = None,
    robustness: bool | str = True, rtol_grid: tuple[float, ...] | None = robust.DEFAULT_RTOL_GRID,
) -> AssumptionResult:
    """:func:`assumption3` from the contexts' means (:func:`context_means`, (N, d) float64) instead of the
    contexts: the same result for contexts of ``dtype`` (not float64), which a caller may reduce chunk by
    chunk without ever holding them all. ``n``: the context length (the subset size)."""
    q = validate_vectors(queries, "queries")
    if dtype == torch.float64:
        raise ValueError("float64 contexts are tested by assumption3 on the contexts themselves (queries and "
                         "contexts share one scale there); assumption3_from_means takes other dtypes")
    if tuple(means.shape) != tuple(q.shape):
        raise ValueError(f"queries {tuple(q.shape)} do not match the context means {tuple(means.shape)}; "
                         "expected both (N, d)")
    n = check_n(n)
    threshold = check_threshold(threshold)
    mixed = q.to(torch.float64) + means  # (N, d)
    return _assumption3_of(mixed, n, dtype, subsets, seed, rtol, threshold=threshold, progress=progress,
                           robustness=robustness, rtol_grid=rtol_grid)


def _assumption3_of(mixed: torch.Tensor, n: int, dtype: torch.dtype, subsets: int, seed: int,
                    rtol: float | None, *, threshold: float, progress: bool | None, robustness: bool | str,
                    rtol_grid: tuple[float, ...] | None) -> AssumptionResult:
    """Assumption 3 on its vectors e(t) + mean E(t) (N, d) float64, for tokens of ``dtype``."""
    rtol = resolve_rtol(rtol, n, mixed.shape[1], dtype)  # judged at the tokens' own dtype
    res = checked_kruskal(mixed, n, subsets, seed, rtol, rank_sample=100, progress=progress,
                          robustness=robustness, rtol_grid=rtol_grid, threshold=threshold)
    res = dataclasses.replace(res, dtype=str(dtype).removeprefix("torch."))
    return from_kruskal("assumption3", res, threshold, n)


def general_position(
    vectors: Array, subsets: int = 5000, seed: int = 0, rtol: float | None = None, *,
    threshold: float = DEFAULT_THRESHOLD, n: int | None = None, progress: bool | None = None,
    robustness: bool | str = True, rtol_grid: tuple[float, ...] | None = robust.DEFAULT_RTOL_GRID,
) -> AssumptionResult:
    """General position: Kruskal rank = min(N, d), sampled at k = min(N, d). ``vectors``: (N, d).

    ``n`` (optional) is only recorded in the result; subsets, seed, rtol, progress, robustness,
    rtol_grid: as in :func:`probes.kruskal_test` (the critical tolerance refers to ``threshold``).
    """
    x = validate_vectors(vectors)
    threshold = check_threshold(threshold)
    n = None if n is None else check_n(n)
    k = min(x.shape)
    res = checked_kruskal(x, k, subsets, seed, rtol, rank_sample=100, progress=progress,
                          robustness=robustness, rtol_grid=rtol_grid, threshold=threshold)
    return from_kruskal("general_position", res, threshold, n)


def assumption2(
    contexts: Array, rtol: float | None = None, *, threshold: float = DEFAULT_THRESHOLD,
    ranks: ContextRanks | None = None,
    robustness: bool | str = True, rtol_grid: tuple[float, ...] | None = robust.DEFAULT_RTOL_GRID,
) -> AssumptionResult:
    """Assumption 2: every context matrix (n x d) has rank n.

    Args:
        contexts: (N, n, d).
        threshold: share of rank-n contexts required (default :data:`DEFAULT_THRESHOLD`, 0.99, as the
            Kruskal tests; 1.0: every context, as the assumption states it and the audit asks).
        ranks: the result of :func:`context_ranks` on the same contexts and rtol, if already computed.
        robustness, rtol_grid: as in :func:`probes.kruskal_test`; at threshold 1 the critical
            tolerance is the smallest sigma_n / sigma_1 over the contexts.
    When n > d no context can have rank n: the result says so (fraction 0).
    """
    start = time.perf_counter()
    e = check_contexts(contexts)
    threshold = check_threshold(threshold)
    robustness = robust.check_robustness(robustness)
    grid = robust.check_rtol_grid(rtol_grid)
    cr = ranks if ranks is not None else context_ranks(e, rtol)
    return assumption2_from_ranks(cr, tuple(e.shape), e.dtype, e.device,
                                  lambda: robust.context_matrices(pow2_rescale(e, (1, 2))[0]),
                                  threshold=threshold, robustness=robustness, rtol_grid=grid, start=start)


def assumption2_from_ranks(
    cr: ContextRanks,
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    matrices: Callable[[], Any],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    robustness: bool | str = True,
    rtol_grid: tuple[float, ...] | None = robust.DEFAULT_RTOL_GRID,
    start: float | None = None,
) -> AssumptionResult:
    """The Assumption 2 result from the contexts' ranks ``cr`` (:func:`context_ranks`, or its blocks joined
    by :meth:`ContextRanks.concat`) of contexts of ``shape`` (N, n, d), ``dtype`` and ``device``, as
    :func:`assumption2` forms it. ``matrices()`` gives the contexts for the tolerance analysis
    (:class:`probes.robust.Matrices`, e.g. :func:`probes.robust.context_reader`), called only when it runs,
    so a caller that streamed its contexts reads them back only then. ``start``: the
    ``time.perf_counter()`` the result's seconds count from (default: now)."""
    start = time.perf_counter() if start is None else start
    threshold = check_threshold(threshold)
    robustness = robust.check_robustness(robustness)
    grid = robust.check_rtol_grid(rtol_grid)
    n_ex, n, d = shape
    common = dict(test="assumption2", k=n, N=n_ex, n=n, d=d, threshold=threshold, subsets=n_ex,
                  exhaustive=True, dtype=str(dtype).removeprefix("torch."), device=str(device), seed=None)
    full = cr.rank == n
    bad = (~full).nonzero().flatten()
    note = f"n = {n} > d = {d}: no context can have rank n" if n > d else ""
    fraction = float(full.double().mean())
    dec = fast.Decisions(cr.rank, cr.margin, cr.stages, bound=cr.bound)
    min_margin, margin_bound = robust.margin_summary(dec)
    rob = robust.Robustness(margin_bound=margin_bound)
    if robustness and note:
        rob = dataclasses.replace(robust.trivial(grid), margin_bound=margin_bound)
    elif robustness:
        min_margin, rob = robust.analyse(matrices(), dec, cr.rtol, threshold, grid,
                                         exact=robustness == "exact")
    return AssumptionResult(
        share_meets_threshold=not note and fraction >= threshold, fraction=fraction, rtol=cr.rtol,
        min_margin=min_margin,
        robustness=rob,
        witness=(int(bad[0]),) if bad.numel() else None,
        rank_counts=dict(sorted(Counter(cr.rank.tolist()).items())),
        seconds=time.perf_counter() - start, stages=cr.stages, note=note, **common,
    )
