"""Kruskal rank of a set of vectors: sampled tests, sweeps over k, and an exact search for small sets.

The Kruskal rank of N vectors is the largest k such that EVERY k-subset is linearly independent.
Computing it is NP-hard, so the auditor samples: ``kruskal_test`` checks ``subsets`` random k-subsets
(or all of them when there are no more than that) and reports the share that is full rank. Sampling
can never prove Kruskal rank >= k, but a single dependent subset (the *witness*) proves Kruskal
rank < k, and the witness is returned so anyone can re-check it.

A subset's rank uses the rule of :func:`probes.numerical_rank` with ``rtol = max(k, d) * eps`` of the
vectors' dtype by default (the k x d matrix of the subset). The work runs through
:mod:`probes._fast`: one float64 Gram matrix of the pool, then batched Cholesky of the k x k principal
submatrices, with exact fallbacks, so verdicts equal a float64 SVD at the same tolerance.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
import torch

from probes import _fast
from probes.rank import Array, as_tensor, check_finite, numerical_rank, resolve_rtol

POOL_GRAM_MAX_N = 8192  # above this the (N, N) pool Gram would not pay off; Gram per subset instead


@dataclass(frozen=True)
class KruskalResult:
    """Outcome of testing k-subsets of N vectors in R^d.

    Attributes:
        k, N, d: subset size, pool size, width.
        subsets: number of subsets tested; ``exhaustive`` when these were all C(N, k) of them.
        full_rank: how many tested subsets had rank k; ``fraction = full_rank / subsets``.
        rank_counts: histogram {rank: count} over the tested subsets.
        min_margin: smallest margin in decades over the tested subsets (a proven lower bound where the
            fast path certified a subset, exact elsewhere; see :mod:`probes._fast`).
        witness: sorted indices of one dependent subset (proof that Kruskal rank < k), or None.
        rtol: relative tolerance used; ``dtype``: dtype the vectors were given in; ``device``.
        seed, seconds, stages: sampling seed, wall time, how many subsets each stage decided.
        note: why a verdict is trivial (e.g. k > d), else empty.
    """

    k: int
    N: int
    d: int
    subsets: int
    exhaustive: bool
    full_rank: int
    fraction: float
    rank_counts: dict[int, int]
    min_margin: float
    witness: tuple[int, ...] | None
    rtol: float
    dtype: str
    device: str
    seed: int
    seconds: float
    stages: dict[str, int] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Flat dict for a report row (histogram and witness as compact strings)."""
        out = asdict(self)
        out["rank_counts"] = ";".join(f"{r}:{c}" for r, c in sorted(self.rank_counts.items()))
        out["witness"] = "" if self.witness is None else " ".join(map(str, self.witness))
        out["stages"] = ";".join(f"{s}:{c}" for s, c in self.stages.items())
        return out


def validate_vectors(vectors: Array, name: str = "vectors") -> torch.Tensor:
    """Check an (N, d) set of vectors: a real, finite, non-empty matrix."""
    x = as_tensor(vectors, name)
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (N, d); got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty (N >= 1, d >= 1); got shape {tuple(x.shape)}")
    check_finite(x, name)
    return x


def _check_k(k: Any, n_vectors: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if k > n_vectors:
        raise ValueError(f"k = {k} exceeds the number of vectors N = {n_vectors}; valid: 1 <= k <= N")
    return k


def _check_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def sample_subsets(n_vectors: int, k: int, count: int, seed: int) -> torch.Tensor:
    """``count`` uniformly random k-subsets of range(N), each sorted: (count, k) int64, on the CPU.

    Reproducible: the same (N, k, count, seed) always gives the same subsets, on any device.
    """
    gen = torch.Generator().manual_seed(seed)
    rows_per_chunk = max(1, 2**24 // n_vectors)
    parts = []
    for start in range(0, count, rows_per_chunk):
        rows = min(rows_per_chunk, count - start)
        keys = torch.rand(rows, n_vectors, generator=gen)  # (rows, N)
        parts.append(keys.topk(k, dim=1).indices.sort(dim=1).values)  # (rows, k)
    return torch.cat(parts)


def all_subsets(n_vectors: int, k: int) -> torch.Tensor:
    """Every k-subset of range(N) in lexicographic order: (C(N, k), k) int64 (callers bound C(N, k))."""
    flat = itertools.chain.from_iterable(itertools.combinations(range(n_vectors), k))
    return torch.tensor(list(flat), dtype=torch.int64).reshape(-1, k)


def _pool_gram(x64: torch.Tensor) -> torch.Tensor | None:
    return x64 @ x64.T if x64.shape[0] <= POOL_GRAM_MAX_N else None  # (N, N)


def _test_subsets(
    x64: torch.Tensor,
    subsets: torch.Tensor,
    rtol: float,
    gram: torch.Tensor | None,
    *,
    spectrum: torch.Tensor | None = None,
    exact_dependent: int | None = None,
) -> _fast.Decisions:
    lam_cap = None if spectrum is None else float(spectrum[0]) ** 2
    return _fast.subset_decisions(x64, subsets.to(x64.device), rtol, gram, lam_cap=lam_cap,
                                  exact_dependent=exact_dependent)


def kruskal_test(
    vectors: Array,
    k: int,
    subsets: int = 5000,
    seed: int = 0,
    rtol: float | None = None,
    *,
    rank_sample: int | None = 100,
    _gram: torch.Tensor | None = None,
    _spectrum: torch.Tensor | None = None,
) -> KruskalResult:
    """Test whether random k-subsets of ``vectors`` are linearly independent.

    Args:
        vectors: (N, d) the pool (e.g. the N query tokens), on CPU or CUDA; computed on its device.
        k: subset size, 1 <= k <= N. For k > d no k vectors can be independent: the result says so
            (fraction 0) without testing.
        subsets: how many random subsets to test; when C(N, k) <= subsets every subset is tested once.
        seed: sampling seed (same seed, same subsets, on any device).
        rtol: relative tolerance; default ``max(k, d) * eps`` of the vectors' dtype.
        rank_sample: how many dependent subsets get an exact rank for the histogram. Dependent
            subsets beyond these are proven dependent by a shifted Cholesky factorisation (see
            :mod:`probes._fast`) without computing their rank: they count in ``fraction`` but not in
            ``rank_counts`` or ``min_margin`` (the ``note`` says how many). None: exact ranks for all.
            When every k-subset is provably dependent (see ``note``), only this many subsets are
            decomposed at all.

    Returns:
        :class:`KruskalResult` (``.fraction``, ``.rank_counts``, ``.min_margin``, ``.witness``).

    Raises:
        ValueError: wrong shape, empty or non-finite vectors, k outside 1..N, subsets < 1, bad rtol.
    """
    start = time.perf_counter()
    x = validate_vectors(vectors)
    n_vec, d = x.shape
    k = _check_k(k, n_vec)
    subsets = _check_count("subsets", subsets)
    rtol = resolve_rtol(rtol, k, d, x.dtype)
    common = dict(k=k, N=n_vec, d=d, rtol=rtol, dtype=str(x.dtype).removeprefix("torch."),
                  device=str(x.device), seed=seed)
    total = math.comb(n_vec, k)
    exhaustive = total <= subsets
    if k > d:
        return KruskalResult(
            subsets=0, exhaustive=False, full_rank=0, fraction=0.0, rank_counts={}, min_margin=math.inf,
            witness=tuple(range(k)), seconds=time.perf_counter() - start,
            note=f"k = {k} > d = {d}: any {k} vectors in R^{d} are dependent", **common,
        )
    if exhaustive:
        idx = all_subsets(n_vec, k)
    else:
        idx = sample_subsets(n_vec, k, subsets, seed)  # (S, k)
    x64 = x.to(torch.float64)
    gram = _gram if _gram is not None else _pool_gram(x64)
    note = ""
    spectrum = _spectrum if _spectrum is not None else pool_spectrum(x64)
    if k > 1 and _all_subsets_dependent(x64, k, rtol, spectrum):
        # Interlacing proves every k-subset dependent: only a sample is needed for the rank histogram.
        idx = idx[: 100 if rank_sample is None else max(1, rank_sample)]
        note = (f"every {k}-subset is dependent (sigma_{k} of the whole set is below the smallest "
                f"possible subset tolerance); rank histogram from {idx.shape[0]} subsets")
    dec = _test_subsets(x64, idx, rtol, gram, spectrum=spectrum, exact_dependent=None if note else rank_sample)
    full = dec.rank == k
    dependent = (~full).nonzero().flatten()
    witness = tuple(idx[int(dependent[0])].tolist()) if dependent.numel() else None
    known = dec.rank >= 0
    counts = Counter(dec.rank[known].tolist())
    unranked = int((~known).sum())
    if unranked:
        note = (f"{unranked} of {idx.shape[0]} subsets proven dependent by a shifted Cholesky "
                f"factorisation without an exact rank; rank histogram and min margin from the other "
                f"{idx.shape[0] - unranked}")
    tested = subsets if note and not unranked else int(idx.shape[0])
    margins = dec.margin[known]
    return KruskalResult(
        subsets=tested, exhaustive=exhaustive or bool(note and not unranked), full_rank=int(full.sum()),
        fraction=float(full.double().mean()), rank_counts=dict(sorted(counts.items())),
        min_margin=float(margins.min()) if margins.numel() else math.nan, witness=witness,
        seconds=time.perf_counter() - start, stages=dec.stages, note=note, **common,
    )


def pool_spectrum(x64: torch.Tensor) -> torch.Tensor:
    """Singular values (descending) of the whole (N, d) set, float64."""
    return torch.linalg.svdvals(x64)


def _all_subsets_dependent(x64: torch.Tensor, k: int, rtol: float, spectrum: torch.Tensor) -> bool:
    """True when EVERY k-subset is provably rank-deficient at its own tolerance.

    Removing rows never increases singular values, so sigma_k(X_S) <= sigma_k(X). Each subset's
    tolerance is rtol * sigma_1(X_S) >= rtol * max_{i in S} |x_i| >= rtol * nu_k, where nu_k is the k-th
    smallest row norm of the whole set. So sigma_k(X) <= rtol * nu_k (with a float64 safety margin)
    settles every subset at once, e.g. general position at k = d for tokens of lower rank.
    """
    if k > spectrum.numel():
        return True
    slack = float(spectrum[0]) * 64 * sum(x64.shape) * torch.finfo(torch.float64).eps
    nu_k = float(x64.norm(dim=1).sort().values[k - 1])
    return float(spectrum[k - 1]) + slack < rtol * nu_k


def check_witness(vectors: Array, witness: tuple[int, ...], rtol: float | None = None) -> bool:
    """Re-check a witness with a plain float64 SVD: True when those vectors are dependent."""
    x = validate_vectors(vectors)
    sub = x[list(witness)]  # (k, d)
    res = numerical_rank(sub, rtol)
    return int(res.rank) < len(witness)


@dataclass(frozen=True)
class SweepResult:
    """Kruskal tests over several k.

    Attributes:
        results: one :class:`KruskalResult` per k, in increasing k.
        lower_estimate: largest tested k whose sampled subsets (and all smaller tested k's) were all
            full rank (an estimate: sampling cannot prove it), or 0.
        upper_bound: certified: Kruskal rank <= upper_bound, from the smallest k with a witness (k - 1);
            None when no dependent subset was found.
        refined: the k that bisection added (see ``refine`` in :func:`kruskal_sweep`).
    """

    results: list[KruskalResult]
    lower_estimate: int
    upper_bound: int | None
    refined: tuple[int, ...] = ()

    def frame(self) -> pd.DataFrame:
        """One row per k (``refined``: added by bisection rather than asked for)."""
        frame = pd.DataFrame([r.to_dict() for r in self.results])
        return frame.assign(refined=frame["k"].isin(self.refined))


def kruskal_sweep(
    vectors: Array,
    ks: list[int] | range,
    subsets: int = 5000,
    seed: int = 0,
    rtol: float | None = None,
    *,
    refine: int = 0,
    progress: bool = False,
) -> SweepResult:
    """Run :func:`kruskal_test` for every k in ``ks`` (the full-rank fraction curve against k).

    The pool's Gram matrix is formed once and shared by every k. ``rtol`` None uses the default for
    each k (``max(k, d) * eps``). ``refine``: up to this many extra k, each halving the gap between the
    lower estimate and the first k with a dependent subset (bisection), so the Kruskal rank estimate is
    known to within ``gap / 2**refine``; stops early once the gap is 1. Refined k are marked in
    ``SweepResult.frame()`` (column ``refined``).
    """
    x = validate_vectors(vectors)
    ks = sorted({_check_k(k, x.shape[0]) for k in ks})
    if not ks:
        raise ValueError("ks must list at least one subset size")
    x64 = x.to(torch.float64)
    gram, spectrum = _pool_gram(x64), pool_spectrum(x64)
    results = []
    iterator = ks
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(ks, desc="kruskal sweep", unit="k")
    def test(k: int) -> KruskalResult:
        return kruskal_test(x, k, subsets=subsets, seed=seed, rtol=rtol, _gram=gram, _spectrum=spectrum)

    results = [test(k) for k in iterator]
    refined: list[int] = []
    for _ in range(_check_count("refine", refine) if refine else 0):
        lower = _lower_estimate(results)
        first_bad = next((r.k for r in results if r.fraction < 1.0), None)
        if first_bad is None or first_bad - lower <= 1:
            break
        k = (lower + first_bad) // 2
        refined.append(k)
        results = sorted([*results, test(k)], key=lambda r: r.k)
    upper = next((r.k - 1 for r in results if r.witness is not None), None)
    return SweepResult(results=results, lower_estimate=_lower_estimate(results), upper_bound=upper,
                       refined=tuple(refined))


def _lower_estimate(results: list[KruskalResult]) -> int:
    """Largest tested k below the first k with a dependent subset (0 when the first one fails)."""
    lower = 0
    for r in results:
        if r.fraction < 1.0:
            break
        lower = r.k
    return lower


def kruskal_rank_exact(vectors: Array, rtol: float | None = None, *, max_subsets: int = 2_000_000) -> int:
    """Exact Kruskal rank of a small set: test every k-subset for k = 1, 2, ... and stop at the first
    k with a dependent subset.

    Pruning: the search never goes past the numerical rank r of the whole set (no r + 1 vectors of an
    r-dimensional span are independent), and each level stops at its first dependent chunk.

    Args:
        vectors: (N, d).
        rtol: relative tolerance for each subset (default ``max(k, d) * eps`` per k).
        max_subsets: refuse when the worst case would test more subsets than this.

    Raises:
        ValueError: bad input, or a search larger than ``max_subsets`` (use :func:`kruskal_sweep`).
    """
    x = validate_vectors(vectors)
    n_vec, d = x.shape
    _check_count("max_subsets", max_subsets)
    pool_rank = int(numerical_rank(x, rtol).rank)
    top = min(pool_rank + 1, n_vec, d)
    worst = sum(math.comb(n_vec, j) for j in range(1, top + 1))
    if worst > max_subsets:
        raise ValueError(
            f"exact Kruskal rank of N = {n_vec} vectors would test up to {worst:,} subsets "
            f"(> max_subsets = {max_subsets:,}); use kruskal_sweep for a sampled estimate"
        )
    x64 = x.to(torch.float64)
    gram = x64 @ x64.T  # (N, N)
    chunk = 65536
    for k in range(1, top + 1):
        r = resolve_rtol(rtol, k, d, x.dtype)
        combos = itertools.combinations(range(n_vec), k)
        while block := list(itertools.islice(combos, chunk)):
            dec = _test_subsets(x64, torch.tensor(block, dtype=torch.int64), r, gram)
            if bool((dec.rank < k).any()):
                return k - 1
    return top
