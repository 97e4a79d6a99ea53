"""Kruskal rank of a set of vectors: sampled tests, sweeps over k, and an exact search for small sets.

The Kruskal rank of N vectors is the largest k such that EVERY k-subset is linearly independent.
Computing it is NP-hard, so the auditor samples: ``kruskal_test`` checks ``subsets`` random k-subsets
(or all of them when there are no more than that) and reports the share that is full rank. Sampling
can never prove Kruskal rank >= k, but a single dependent subset (the *witness*) proves Kruskal
rank < k, and the witness is returned so anyone can re-check it.

A subset's rank uses the rule of :func:`probes.numerical_rank` with ``rtol = max(k, d) * eps`` of the
vectors' dtype by default (the k x d matrix of the subset). The work runs through
:mod:`probes.fast`: one float64 Gram matrix of the pool, then batched Cholesky of the k x k principal
submatrices, with exact fallbacks, so verdicts equal a float64 SVD at the same tolerance.

Bounds and progress. Every function here does a bounded amount of work:

- ``kruskal_test``: at most ``subsets`` subsets (default 5000, as ``audit --subsets``);
- ``kruskal_sweep``: at most ``subsets`` per k (default 500, as ``audit --sweep-subsets``), and
  ``max_seconds`` stops it from starting another k once that much time has passed;
- ``kruskal_rank_exact``: refuses searches of more than ``max_subsets`` subsets (default 2,000,000).

Subset counts whose indices would not fit in memory (:data:`MAX_INDEX_BYTES`, see
:func:`max_subsets_in_memory`) are refused with a ValueError that gives the valid range. ``progress``
(default None, automatic) shows a ``tqdm`` bar when the work is large (more than
:data:`LARGE_SUBSETS` subsets, or k >= :data:`LARGE_K`) and the output is interactive (stderr a
terminal, or a notebook); True always shows one, False never.
"""

from __future__ import annotations

import itertools
import math
import numbers
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from probes import fast, robust
from probes.rank import (
    Array,
    abs_max,
    as_tensor,
    check_finite,
    check_int,
    check_seed,
    numerical_rank,
    pow2_rescale,
    resolve_rtol,
)

POOL_GRAM_MAX_N = 8192  # above this the (N, N) pool Gram would not pay off; Gram per subset instead
MAX_INDEX_BYTES = 2 * 2**30  # memory allowed for the subsets of one test: indices plus per-subset results
LARGE_SUBSETS = 1000  # automatic progress: more subsets than this ...
LARGE_K = 256  # ... or subsets at least this large
TINY_EXPONENT = -400  # subsets of rows whose entries all lie below 2**-400 are decided at their own scale


def max_subsets_in_memory(k: int) -> int:
    """The most k-subsets one test may hold: their int64 indices and per-subset results (rank and
    margin) within :data:`MAX_INDEX_BYTES`."""
    return MAX_INDEX_BYTES // (8 * k + 16)


def _check_memory(count: int, k: int, name: str = "subsets") -> None:
    limit = max_subsets_in_memory(k)
    if count > limit:
        need = count * (8 * k + 16) / 2**30
        raise ValueError(
            f"{name} = {count:,} subsets of size k = {k} would need {need:,.1f} GiB for their indices "
            f"(limit {MAX_INDEX_BYTES / 2**30:g} GiB); valid: 1 <= {name} <= {limit:,} at k = {k}"
        )


def progress_bar(progress: bool | None, *, large: bool, total: int, desc: str, unit: str = "subset"):
    """A ``tqdm.auto`` bar, or None.

    ``progress`` True: always a bar; False: never; None (automatic): a bar when the work is ``large``,
    shown only when the output is interactive (tqdm's ``disable=None``: stderr is a terminal, or the
    code runs in a notebook). Nested bars (e.g. inside an outer loop's bar) disappear when done.
    """
    if progress is not None and not isinstance(progress, bool):
        raise ValueError(f"progress must be True, False or None (automatic), got {progress!r}")
    if progress is False or (progress is None and not large):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=None, disable=None if progress is None else False)


def _fmt_witness(witness: tuple[int, ...] | None, show: int = 8) -> str:
    if witness is None:
        return ""
    if len(witness) <= show:
        return f", witness={list(witness)}"
    head = ", ".join(map(str, witness[:show]))
    return f", witness=[{head}, ... ({len(witness)} indices)]"


def flatten_row(row: dict[str, Any]) -> dict[str, Any]:
    """A ``to_dict()`` row with its structured fields as compact strings, for one CSV cell each:
    ``rank_counts`` ``{196: 3, 197: 4997}`` -> ``"196:3;197:4997"``, ``witness`` ``[2, 6]`` -> ``"2 6"``
    (None -> ``""``), ``stages`` ``{"cholesky": 5000, ...}`` -> ``"cholesky:5000;..."``, ``rtol_grid``
    ``{0.1: 1.0, 10.0: 0.5}`` -> ``"0.1:1.0;10:0.5"`` (None -> ``""``)."""
    out = dict(row)
    if "rtol_grid" in out and not isinstance(out["rtol_grid"], str):
        grid = out["rtol_grid"]
        out["rtol_grid"] = (
            "" if grid is None else ";".join(f"{m:g}:{float(f)!r}" for m, f in sorted(grid.items()))
        )
    if isinstance(out.get("rank_counts"), dict):
        out["rank_counts"] = ";".join(f"{r}:{c}" for r, c in sorted(out["rank_counts"].items()))
    if "witness" in out and not isinstance(out["witness"], str):
        out["witness"] = "" if out["witness"] is None else " ".join(map(str, out["witness"]))
    if isinstance(out.get("stages"), dict):
        out["stages"] = ";".join(f"{s}:{c}" for s, c in out["stages"].items())
    return out


@dataclass(frozen=True, repr=False)
class KruskalResult:
    """Outcome of testing k-subsets of N vectors in R^d.

    Attributes:
        k, N, d: subset size, pool size, width.
        subsets: number of subsets tested; ``exhaustive`` when these were all C(N, k) of them,
            enumerated one by one.
        spectrum_proof: every k-subset is proven dependent at once by the spectrum of the whole pool
            (sigma_k of the set below the smallest possible subset tolerance, see ``note``); then
            ``subsets`` counts the subsets the verdict covers and only a sample was decomposed for the
            rank histogram.
        full_rank: how many tested subsets had rank k; ``fraction = full_rank / subsets``.
        rank_counts: histogram {rank: count} over the tested subsets.
        min_margin: smallest margin in decades over the tested subsets with a known rank: for a
            full-rank subset log10(sigma_k / (rtol sigma_1)), for a dependent one the distance from the
            threshold to the nearer of sigma_r and sigma_{r+1}. Exact (float64 singular values) unless
            ``margin_bound``.
        robustness: how the verdict "every tested subset is full rank" depends on the tolerance
            (:class:`probes.robust.Robustness`: ``margin_bound``, ``critical_rtol`` (the smallest
            sigma_k / sigma_1 over the tested subsets) with its proven bracket, ``verdict_margin``,
            ``rtol_grid``).
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
    robustness: robust.Robustness = field(default_factory=robust.Robustness)
    spectrum_proof: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Flat dict of typed values: ints (k, N, d, subsets, full_rank, seed), bools (exhaustive,
        spectrum_proof, margin_bound, critical_rtol_exact: None without robustness), floats (fraction,
        min_margin, rtol, seconds, critical_rtol, critical_rtol_low, critical_rtol_high, verdict_margin; NaN
        where robustness was off), ``rank_counts`` dict[int, int], ``witness`` list[int] or None, ``stages``
        dict[str, int], ``rtol_grid`` dict[float, float] or None. :func:`flatten_row` turns it into CSV
        cells."""
        return result_dict(self)

    def __repr__(self) -> str:
        text = (
            f"KruskalResult(k={self.k}, N={self.N}, d={self.d}: fraction={self.fraction:.4f} "
            f"({self.full_rank}/{self.subsets} full rank) "
            f"{_fmt_scope(self.subsets, self.exhaustive, self.spectrum_proof)}, "
            f"min_margin={self.min_margin:.2f} decades{_fmt_critical(self)}{_fmt_witness(self.witness)}"
        )
        return text + (f"; {self.note}" if self.note else "") + ")"


def _fmt_scope(subsets: int, exhaustive: bool, spectrum_proof: bool) -> str:
    """``over all 120 subsets`` (enumerated), ``over 5000 subsets, every one proven dependent by the pool's
    spectrum``, or ``over 5000 sampled subsets``."""
    if exhaustive:
        return f"over all {subsets} subsets"
    if spectrum_proof:
        return f"over {subsets} subsets, every one proven dependent by the pool's spectrum"
    return f"over {subsets} sampled subsets"


def result_dict(res: Any) -> dict[str, Any]:
    """``to_dict()`` of a result dataclass: its fields in order, ``robustness`` spread into its own
    fields where it stands, then ``critical_rtol_exact``."""
    out: dict[str, Any] = {}
    for name, value in asdict(res).items():
        if name == "robustness":
            out.update(res.robustness.fields())
        else:
            out[name] = value
    return {**_typed(out), "critical_rtol_exact": res.robustness.exact(res.rtol)}


def _fmt_critical(res: Any) -> str:
    """``, critical_rtol=3.1e-05 in [3.0e-05, 3.1e-05] (exact; ...)``, or ``, critical_rtol in [2e-05,
    9e-05] (bracket only; ...)`` where only the bracket is known; "" without one."""
    rob = res.robustness
    critical, low, high = rob.critical_rtol, rob.critical_rtol_low, rob.critical_rtol_high
    if low is None or math.isnan(low):
        return ""
    if critical is None or math.isnan(critical):
        return f", critical_rtol in [{low:.3g}, {high:.3g}] (bracket only; rtol={res.rtol:.3g})"
    return f", critical_rtol={critical:.3g} in [{low:.3g}, {high:.3g}] (exact; rtol={res.rtol:.3g})"


_INT_FIELDS = ("k", "N", "n", "d", "subsets", "full_rank", "seed")
_FLOAT_FIELDS = (
    "fraction",
    "min_margin",
    "rtol",
    "threshold",
    "seconds",
    "critical_rtol",
    "critical_rtol_low",
    "critical_rtol_high",
    "verdict_margin",
)


def _typed(out: dict[str, Any]) -> dict[str, Any]:
    """Plain Python types for a result dict (no NumPy or torch scalars, no strings for structures)."""
    for key in _INT_FIELDS:
        if out.get(key) is not None:
            out[key] = int(out[key])
    for key in _FLOAT_FIELDS:
        if key in out:
            out[key] = float(out[key])
    for key in ("share_meets_threshold", "exhaustive", "margin_bound", "spectrum_proof"):
        if key in out:
            out[key] = bool(out[key])
    out["witness"] = None if out["witness"] is None else [int(i) for i in out["witness"]]
    out["rank_counts"] = {int(r): int(c) for r, c in sorted(out["rank_counts"].items())}
    out["stages"] = {str(s): int(c) for s, c in out["stages"].items()}
    if out.get("rtol_grid") is not None:
        out["rtol_grid"] = {float(m): float(f) for m, f in sorted(out["rtol_grid"].items())}
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


def pool64(x: torch.Tensor) -> torch.Tensor:
    """The (N, d) pool in float64, rescaled by an exact power of two when its Gram would underflow or
    overflow (see :func:`probes.rank.pow2_rescale`); Kruskal verdicts are scale-invariant."""
    scaled, _ = pow2_rescale(x)
    return scaled.to(torch.float64)


def _check_k(k: Any, n_vectors: int) -> int:
    k = check_int(k, "k")
    if k > n_vectors:
        raise ValueError(f"k = {k} exceeds the number of vectors N = {n_vectors}; valid: 1 <= k <= N")
    return k


def sample_subsets(n_vectors: int, k: int, count: int, seed: int) -> torch.Tensor:
    """``count`` uniformly random k-subsets of range(N), each sorted: (count, k) int64, on the CPU.

    Reproducible: the same (N, k, count, seed) always gives the same subsets, on any device. torch's
    CPU generator (Mersenne Twister) keeps only the low 32 bits of the seed, so seeds that agree modulo
    2**32 (e.g. -1 and 2**32 - 1) give the same subsets; use seeds in [0, 2**32) for distinct draws.

    Raises:
        ValueError: N, k or count not a positive integer, k > N, a seed outside the 64-bit range, or
            more subsets than fit in memory (:func:`max_subsets_in_memory`).
    """
    n_vectors = check_int(n_vectors, "N")
    k = _check_k(k, n_vectors)
    count = check_int(count, "count")
    seed = check_seed(seed)
    _check_memory(count, k, "count")
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
    total = math.comb(n_vectors, k)
    flat = itertools.chain.from_iterable(itertools.combinations(range(n_vectors), k))
    return torch.from_numpy(np.fromiter(flat, dtype=np.int64, count=total * k)).reshape(total, k)


def tiny_rows(x64: torch.Tensor) -> torch.Tensor | None:
    """(N,) bool: the rows of the float64 pool whose largest |entry| lies below ``2**TINY_EXPONENT``
    (zero rows included), or None when there are none (the usual case: one pass over the pool).

    The Gram route's error bounds are relative to each matrix's own trace; underflow adds absolute
    errors of at most 2^-1022 per operation (even with flush-to-zero), far below them while some row of
    the matrix has |entry| >= 2^-400 (squares >= 2^-800). A subset made of such tiny rows only is
    decided at its own scale instead (:func:`_tiny_decisions`): with the pool's scale its squares
    would underflow (a vector 1e-170 times the largest would have rank 0)."""
    amax = abs_max(x64, (1,))[:, 0]  # (N,)
    tiny = amax < 2.0**TINY_EXPONENT
    return tiny if bool(tiny.any()) else None


def tiny_subsets(x64: torch.Tensor, subsets: torch.Tensor) -> torch.Tensor | None:
    """(S,) bool: the subsets (S, k) made of tiny rows only (:func:`tiny_rows`), or None when none is."""
    tiny = tiny_rows(x64)
    if tiny is None:
        return None
    mask = tiny[subsets.to(tiny.device)].all(1)
    return mask if bool(mask.any()) else None


def _tiny_decisions(x64: torch.Tensor, subsets: torch.Tensor, rtol: float, ceilings: bool) -> fast.Decisions:
    """Exact ranks (and, with ``ceilings``, proven floors and ceilings of sigma_k / sigma_1) of subsets of
    tiny rows, each rescaled by an exact power of two of its own first (ranks and ratios are scale
    invariant), by the fast path's stages on the rescaled Gram blocks."""
    rows = x64[subsets.to(x64.device)]  # (t, k, d)
    scaled, _ = pow2_rescale(rows, (-2, -1))
    gram = scaled @ scaled.transpose(1, 2)  # (t, k, k)
    return fast.decide(gram, lambda pos: scaled[pos], rtol, x64.shape[1], ceilings=ceilings)


def _merge(parts: list[tuple[torch.Tensor, fast.Decisions]], count: int, k: int, device: torch.device,
           ceilings: bool) -> fast.Decisions:
    """One :class:`probes.fast.Decisions` of ``count`` subsets from decisions of disjoint positions."""
    out = fast.Decisions.empty(count, k, device, ceilings=ceilings)
    for pos, dec in parts:
        pos = pos.to(device)
        out.rank[pos], out.margin[pos], out.bound[pos] = dec.rank, dec.margin, dec.bound
        if dec.fail_at is not None:
            out.fail_at[pos] = dec.fail_at
        if ceilings:
            out.ceiling[pos], out.floor[pos] = dec.ceiling, dec.floor
        for key, value in dec.stages.items():
            out.stages[key] += value
        out.shortcut += dec.shortcut
        out.dip_tried += dec.dip_tried
        out.dip_proven += dec.dip_proven
    return out


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
    bar=None,
    grid: tuple[float, ...] | None = None,
    threshold: float = 1.0,
) -> fast.Decisions:
    """Decide every subset (the progress ``bar``, if any, advances after each chunk). ``grid``: the
    robustness grid that will follow (``()`` for the tolerance fields without a grid), None without
    tolerance fields (subsets are certified at its largest multiplier where that is cheap, or near the
    critical tolerance of the verdict at ``threshold`` where that lies beyond it, and dependent ones get
    ceilings, so that the grid and the critical tolerance need few new proofs)."""
    tiny = tiny_subsets(x64, subsets)
    if tiny is not None:  # (subsets of tiny rows only: decided at their own scale)
        k, ceilings = int(subsets.shape[1]), grid is not None
        rest = (~tiny).nonzero().flatten()
        parts = [(tiny.nonzero().flatten(), _tiny_decisions(x64, subsets[tiny], rtol, ceilings))]
        if bar is not None:
            bar.update(int(tiny.sum()))
        if rest.numel():
            parts.append((rest, _test_subsets(x64, subsets[rest], rtol, gram, spectrum=spectrum,
                                              exact_dependent=exact_dependent, bar=bar, grid=grid,
                                              threshold=threshold)))
        return _merge(parts, int(subsets.shape[0]), k, x64.device, ceilings)
    lam_cap = None if spectrum is None else float(spectrum[0]) ** 2
    top = max(grid) if grid else 1.0
    low = min(grid) if grid else 1.0
    return fast.subset_decisions(
        x64,
        subsets.to(x64.device),
        rtol,
        gram,
        lam_cap=lam_cap,
        exact_dependent=exact_dependent,
        on_chunk=None if bar is None else bar.update,
        reach=math.log10(top) * (1 + 1e-6) if top > 1 else None,
        ceilings=grid is not None,
        dip=low * (1 - 1e-6) if low < 1 else None,
        aim=robust.critical_quantile(threshold, int(subsets.shape[0])) if grid is not None else None,
    )


def kruskal_test(
    vectors: Array,
    k: int,
    subsets: int = 5000,
    seed: int = 0,
    rtol: float | None = None,
    *,
    rank_sample: int | None = 100,
    progress: bool | None = None,
    robustness: bool | str = True,
    rtol_grid: tuple[float, ...] | None = robust.DEFAULT_RTOL_GRID,
) -> KruskalResult:
    """Test whether random k-subsets of ``vectors`` are linearly independent.

    Args:
        vectors: (N, d) the pool (e.g. the N query tokens), on CPU or CUDA; computed on its device.
        k: subset size, 1 <= k <= N (Python or NumPy integer). For k > d no k vectors can be
            independent: the result says so (fraction 0) without testing.
        subsets: how many random subsets to test; when C(N, k) <= subsets every subset is tested once.
            The subsets actually tested must fit in memory (:func:`max_subsets_in_memory`).
        seed: sampling seed, an integer in [-2**63, 2**63 - 1] (same seed, same subsets, on any device).
        rtol: relative tolerance; default ``max(k, d) * eps`` of the vectors' dtype.
        rank_sample: how many dependent subsets (the first ones, in subset order) get an exact rank
            for the histogram, beside any the fast path decides exactly anyway. Dependent
            subsets beyond these are proven dependent by a shifted Cholesky factorisation (see
            :mod:`probes.fast`) without computing their rank: they count in ``fraction`` but not in
            ``rank_counts`` or ``min_margin`` (the ``note`` says how many). None: exact ranks for all.
            When every k-subset is provably dependent (see ``note``), only this many subsets are
            decomposed at all.
        progress: None (automatic): a progress bar for large tests (more than 1000 subsets, or
            k >= 256) when the output is interactive; True: always; False: never.
        robustness: also say how the verdict depends on the tolerance (``critical_rtol`` and its
            bracket, ``verdict_margin``, ``rtol_grid``) and make ``min_margin`` exact where affordable
            (see :mod:`probes.robust`), within work caps that keep its cost near the test's: where they
            stop, the bracket is the proven one and ``critical_rtol_exact`` False; ``"exact"``: the same
            without the caps (exact spectra wherever the bracket or the smallest margin still needs
            them: every bracket closes to 3%, 10% beyond 10x either side, or to float64 resolution; it
            can cost many times the test); False: the plain test, at its plain cost (those fields NaN
            / None, ``min_margin`` a proven lower bound where ``margin_bound``).
        rtol_grid: multipliers of rtol at which to report the fraction (default 0.1x to 10x); None:
            no grid. Only with ``robustness``.

    Returns:
        :class:`KruskalResult` (``.fraction``, ``.rank_counts``, ``.min_margin``, ``.witness``).

    Raises:
        ValueError: wrong shape, empty or non-finite vectors, k outside 1..N, subsets < 1 or beyond
            memory, a non-integer or out-of-range seed, bad rtol.
    """
    return checked_kruskal(vectors, k, subsets, seed, rtol, rank_sample=rank_sample, progress=progress,
                           robustness=robustness, rtol_grid=rtol_grid, threshold=1.0)


def checked_kruskal(vectors: Array, k: int, subsets: int, seed: int, rtol: float | None, *,
                    rank_sample: int | None, progress: bool | None, robustness: bool | str,
                    rtol_grid: Any, threshold: float) -> KruskalResult:
    """:func:`kruskal_test` with the share ``threshold`` its ``critical_rtol`` refers to (the
    assumption tests use theirs)."""
    start = time.perf_counter()
    x = validate_vectors(vectors)
    k = _check_k(k, x.shape[0])
    subsets = check_int(subsets, "subsets")
    seed = check_seed(seed)
    if rank_sample is not None:
        rank_sample = check_int(rank_sample, "rank_sample", minimum=0)
    robustness = robust.check_robustness(robustness)
    grid = robust.check_rtol_grid(rtol_grid)
    return _kruskal(x, None, k, subsets, seed, rtol, rank_sample=rank_sample, progress=progress, start=start,
                    robustness=robustness, grid=grid, threshold=threshold)


def _kruskal(
    x: torch.Tensor,
    x64: torch.Tensor | None,
    k: int,
    subsets: int,
    seed: int,
    rtol: float | None,
    *,
    rank_sample: int | None = 100,
    progress: bool | None = None,
    start: float,
    gram: torch.Tensor | None = None,
    spectrum: torch.Tensor | None = None,
    robustness: bool | str = False,
    grid: tuple[float, ...] | None = None,
    threshold: float = 1.0,
) -> KruskalResult:
    """:func:`kruskal_test` on validated arguments; ``x64`` (the scaled float64 pool), ``gram`` and
    ``spectrum`` may come precomputed from a sweep."""
    n_vec, d = x.shape
    rtol = resolve_rtol(rtol, k, d, x.dtype)
    common = dict(k=k, N=n_vec, d=d, rtol=rtol, dtype=str(x.dtype).removeprefix("torch."),
                  device=str(x.device), seed=seed)
    total = math.comb(n_vec, k)
    exhaustive = total <= subsets
    if k > d:
        rob = robust.trivial(grid) if robustness else robust.Robustness(margin_bound=False)
        return KruskalResult(min_margin=math.inf, robustness=rob,
            subsets=0, exhaustive=False, full_rank=0, fraction=0.0, rank_counts={},
            witness=tuple(range(k)), seconds=time.perf_counter() - start,
            note=f"k = {k} > d = {d}: any {k} vectors in R^{d} are dependent", **common,
        )
    _check_memory(min(total, subsets), k)
    if exhaustive:
        idx = all_subsets(n_vec, k)
    else:
        idx = sample_subsets(n_vec, k, subsets, seed)  # (S, k)
    if x64 is None:
        x64 = pool64(x)
    if gram is None:
        gram = _pool_gram(x64)
    note = ""
    if spectrum is None:
        spectrum = pool_spectrum(x64)
    if k > 1 and robustness != "exact" and _all_subsets_dependent(x64, k, rtol, spectrum):
        # Interlacing proves every k-subset dependent: only a sample is needed for the rank histogram
        # (not with robustness "exact", whose bracket needs every subset's ratio).
        idx = idx[: 100 if rank_sample is None else max(1, rank_sample)]
        note = (f"every {k}-subset is dependent (sigma_{k} of the whole set is below the smallest "
                f"possible subset tolerance); rank histogram from {idx.shape[0]} subsets")
    bar = progress_bar(progress, large=idx.shape[0] > LARGE_SUBSETS or k >= LARGE_K, total=int(idx.shape[0]),
                       desc=f"kruskal k={k}")
    try:
        dec = _test_subsets(x64, idx, rtol, gram, spectrum=spectrum,
                            exact_dependent=None if note else rank_sample, bar=bar,
                            grid=(grid or ()) if robustness and not note else None, threshold=threshold)
    finally:
        if bar is not None:
            bar.close()
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
    spectrum_proof = bool(note and not unranked)
    tested = min(total, subsets) if spectrum_proof else int(idx.shape[0])
    min_margin, margin_bound = robust.margin_summary(dec)
    rob = robust.Robustness(margin_bound=margin_bound)
    if robustness and note and not unranked:  # every subset proven dependent by interlacing
        rob = robust.all_dependent_case(
            rtol,
            _dependent_ceiling(x64, k, spectrum),
            grid,
            lambda t: _fraction_at(x64, k, subsets, seed, exhaustive, t, gram, spectrum),
            threshold,
            margin_bound,
        )
    elif robustness:
        step = fast.subset_step(k, device=x64.device)  # (device-sized chunks off the CPU)
        pool = fast.Pool(x64, gram, k, rtol, float(spectrum[0]) ** 2, step)
        src = robust.pool_matrices(pool, idx.to(x64.device), x64, step, svd_only=tiny_subsets(x64, idx))
        min_margin, rob = robust.analyse(src, dec, rtol, threshold, grid, exact=robustness == "exact")
    return KruskalResult(min_margin=min_margin, robustness=rob,
        subsets=tested, exhaustive=exhaustive and not spectrum_proof, spectrum_proof=spectrum_proof,
        full_rank=int(full.sum()),
        fraction=float(full.double().mean()), rank_counts=dict(sorted(counts.items())), witness=witness,
        seconds=time.perf_counter() - start, stages=dec.stages, note=note, **common,
    )


def _dependent_ceiling(x64: torch.Tensor, k: int, spectrum: torch.Tensor) -> float:
    """A proven upper bound on sigma_k / sigma_1 of every k-subset: (sigma_k of the set + rounding) over
    the k-th smallest row norm (see :func:`_all_subsets_dependent`)."""
    if k > spectrum.numel():
        return 0.0
    slack = float(spectrum[0]) * 64 * sum(x64.shape) * torch.finfo(torch.float64).eps
    nu_k = float(x64.norm(dim=1).sort().values[k - 1])
    return (float(spectrum[k - 1]) + slack) / nu_k * (1 + 1e-9) if nu_k > 0 else 0.0


def _fraction_at(x64: torch.Tensor, k: int, subsets: int, seed: int, exhaustive: bool, t: float,
                 gram: torch.Tensor | None, spectrum: torch.Tensor) -> float:
    """The full-rank share of the test's subsets at tolerance t (all of them decided)."""
    n_vec = x64.shape[0]
    idx = all_subsets(n_vec, k) if exhaustive else sample_subsets(n_vec, k, subsets, seed)
    dec = _test_subsets(x64, idx, t, gram, spectrum=spectrum, exact_dependent=0)
    return float((dec.rank == k).double().mean())


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
    """Re-check a witness with a plain float64 SVD: True when those vectors are dependent.

    ``witness``: distinct row indices (a tuple, list or integer array, e.g. ``KruskalResult.witness``).
    """
    x = validate_vectors(vectors)
    try:
        idx = [check_int(i, "witness index", minimum=0) for i in witness]
    except TypeError:
        raise ValueError(f"witness must be a sequence of row indices, got {witness!r}") from None
    if not idx or len(set(idx)) != len(idx) or max(idx) >= x.shape[0]:
        raise ValueError(f"witness must hold distinct row indices in 0..{x.shape[0] - 1}, got {witness!r}")
    res = numerical_rank(x[idx], rtol)  # (k, d); rescaled there when needed
    return int(res.rank) < len(idx)


@dataclass(frozen=True, repr=False)
class SweepResult:
    """Kruskal tests over several k.

    Attributes:
        results: one :class:`KruskalResult` per k, in increasing k.
        lower_estimate: largest tested k whose sampled subsets (and all smaller tested k's) were all
            full rank (an estimate: sampling cannot prove it), or None when the smallest tested k already
            had a dependent subset (then only ``upper_bound`` is known; :attr:`sampled` says "< k").
        upper_bound: certified: Kruskal rank <= upper_bound, from the smallest k with a witness (k - 1);
            None when no dependent subset was found.
        refined: the k that bisection added (see ``refine`` in :func:`kruskal_sweep`).
        truncated: ``max_seconds`` ran out before every requested k (or bisection step) was tested;
            ``skipped``: the requested k that were not tested.
        seconds: wall time of the whole sweep.
    """

    results: list[KruskalResult]
    lower_estimate: int | None
    upper_bound: int | None
    refined: tuple[int, ...] = ()
    truncated: bool = False
    skipped: tuple[int, ...] = ()
    seconds: float = 0.0

    def frame(self) -> pd.DataFrame:
        """One row per k (``refined``: added by bisection rather than asked for); ``rank_counts``,
        ``witness`` and ``stages`` as compact strings (:func:`flatten_row`)."""
        frame = pd.DataFrame([flatten_row(r.to_dict()) for r in self.results])
        return frame.assign(refined=frame["k"].isin(self.refined))

    @property
    def sampled(self) -> str:
        """The sampled Kruskal rank as an inequality, never a bare number: ``">= k"`` (every tested k up to
        k passed; an estimate), ``"< k"`` (the smallest tested k already had a dependent subset)."""
        if self.lower_estimate is not None:
            return f">= {self.lower_estimate}"
        return f"< {self.results[0].k}"

    def __repr__(self) -> str:
        ks = [r.k for r in self.results]
        refined = f", {len(self.refined)} refined" if self.refined else ""
        text = (
            f"SweepResult(k={ks[0]}..{ks[-1]} ({len(ks)} values{refined}): "
            f"sampled {self.sampled}, lower_estimate={self.lower_estimate}, upper_bound={self.upper_bound}"
        )
        if self.truncated:
            text += f"; truncated by max_seconds, not tested: {list(self.skipped) or 'bisection steps'}"
        return text + ")"


def kruskal_sweep(
    vectors: Array,
    ks: list[int] | range,
    subsets: int = 500,
    seed: int = 0,
    rtol: float | None = None,
    *,
    refine: int = 6,
    progress: bool | None = None,
    max_seconds: float | None = None,
    robustness: bool | str = True,
    rtol_grid: tuple[float, ...] | None = robust.DEFAULT_RTOL_GRID,
) -> SweepResult:
    """Run :func:`kruskal_test` for every k in ``ks`` (the full-rank fraction curve against k).

    The pool's Gram matrix is formed once and shared by every k. ``rtol`` None uses the default for
    each k (``max(k, d) * eps``). ``refine``: up to this many extra k, each halving the gap between the
    lower estimate and the first k with a dependent subset (bisection), so the Kruskal rank estimate is
    known to within ``gap / 2**refine``; stops early once the gap is 1. Refined k are marked in
    ``SweepResult.frame()`` (column ``refined``). The defaults (500 subsets per k, 6 refinement steps)
    are the ``audit --sweep`` defaults; ``refine=0`` runs exactly the given ``ks``.

    Bounds: ``subsets`` per k (default 500, the CLI's ``--sweep-subsets``); ``max_seconds``: no new k
    (requested or bisection) starts once this much time has passed since the call. The first k always
    runs and a k in progress is finished, so the sweep may overrun by one k's time; the result is then
    marked ``truncated`` and lists the ``skipped`` k. ``progress``: None (automatic) shows a bar over
    the k when the sweep is large and the output interactive; True always, False never.
    ``robustness`` and ``rtol_grid``: as in :func:`kruskal_test`, for every k.
    """
    start = time.perf_counter()
    x = validate_vectors(vectors)
    n_vec, d = x.shape
    ks, subsets, seed, refine, grid = _sweep_options(ks, n_vec, subsets, seed, refine, max_seconds,
                                                    robustness, rtol_grid)
    robustness = robust.check_robustness(robustness)  # (valid: checked above; normalised once)
    for k in ks:
        if k <= d:
            _check_memory(min(math.comb(n_vec, k), subsets), k)
    x64 = pool64(x)
    gram, spectrum = _pool_gram(x64), pool_spectrum(x64)
    work = sum(min(math.comb(n_vec, k), subsets) for k in ks if k <= d)
    bar = progress_bar(progress, large=work > LARGE_SUBSETS or ks[-1] >= LARGE_K, total=len(ks),
                       desc="kruskal sweep", unit="k")

    def test(k: int) -> KruskalResult:
        if bar is not None:
            bar.set_postfix(k=k)
        res = _kruskal(x, x64, k, subsets, seed, rtol, progress=False, start=time.perf_counter(),
                       gram=gram, spectrum=spectrum, robustness=robustness, grid=grid)
        if bar is not None:
            bar.update()
        return res

    def out_of_time() -> bool:
        return max_seconds is not None and time.perf_counter() - start > max_seconds

    results: list[KruskalResult] = []
    skipped: tuple[int, ...] = ()
    truncated = False
    refined: list[int] = []
    try:
        for i, k in enumerate(ks):
            if results and out_of_time():
                skipped, truncated = tuple(ks[i:]), True
                break
            results.append(test(k))
        for _ in range(0 if truncated else refine):
            lower = _lower_estimate(results) or 0  # None: bisect below the first tested k
            first_bad = next((r.k for r in results if r.fraction < 1.0), None)
            if first_bad is None or first_bad - lower <= 1:
                break
            if out_of_time():
                truncated = True
                break
            k = (lower + first_bad) // 2
            refined.append(k)
            if bar is not None:
                bar.total += 1
                bar.refresh()
            results = sorted([*results, test(k)], key=lambda r: r.k)
    finally:
        if bar is not None:
            bar.close()
    upper = next((r.k - 1 for r in results if r.witness is not None), None)
    return SweepResult(results=results, lower_estimate=_lower_estimate(results), upper_bound=upper,
                       refined=tuple(refined), truncated=truncated, skipped=skipped,
                       seconds=time.perf_counter() - start)


def _sweep_options(
    ks: Any, n_vec: int, subsets: Any, seed: Any, refine: Any, max_seconds: Any, robustness: Any,
    rtol_grid: Any,
) -> tuple[list[int], int, int, int, tuple[float, ...] | None]:
    """The checked options of :func:`kruskal_sweep`: (sorted distinct ks, subsets, seed, refine, grid);
    a ValueError in the caller's words for any that is not valid."""
    bad_ks = f"ks must be a list of subset sizes (e.g. range(10, 101, 10)), got {ks!r}"
    if isinstance(ks, numbers.Number | str | bytes) or (
        isinstance(ks, torch.Tensor | np.ndarray) and ks.ndim != 1
    ):
        raise ValueError(bad_ks)
    try:
        requested = ks.tolist() if isinstance(ks, torch.Tensor | np.ndarray) else list(ks)
    except TypeError:
        raise ValueError(bad_ks) from None
    ks = sorted({_check_k(k, n_vec) for k in requested})
    if not ks:
        raise ValueError("ks must list at least one subset size")
    subsets = check_int(subsets, "subsets")
    seed = check_seed(seed)
    refine = check_int(refine, "refine", minimum=0)
    robust.check_robustness(robustness)
    grid = robust.check_rtol_grid(rtol_grid)
    if max_seconds is not None and (isinstance(max_seconds, bool) or not isinstance(max_seconds, numbers.Real)
                                    or not 0 < max_seconds < math.inf):
        raise ValueError(f"max_seconds must be a positive number of seconds or None, got {max_seconds!r}")
    return ks, subsets, seed, refine, grid


def _lower_estimate(results: list[KruskalResult]) -> int | None:
    """Largest tested k below the first k with a dependent subset (None when the first one fails)."""
    lower = None
    for r in results:
        if r.fraction < 1.0:
            break
        lower = r.k
    return lower


def kruskal_rank_exact(
    vectors: Array, rtol: float | None = None, *, max_subsets: int = 2_000_000, progress: bool | None = None
) -> int:
    """Exact Kruskal rank of a small set: test every k-subset for k = 1, 2, ... and stop at the first
    k with a dependent subset.

    Pruning: the search never goes past the numerical rank r of the whole set (no r + 1 vectors of an
    r-dimensional span are independent), and each level stops at its first dependent chunk.

    Args:
        vectors: (N, d).
        rtol: relative tolerance for each subset (default ``max(k, d) * eps`` per k).
        max_subsets: refuse when the worst case would test more subsets than this (the bound on time;
            subsets are tested in chunks, so memory stays small).
        progress: None (automatic): a bar over the worst-case subset count when it exceeds 1000 and the
            output is interactive; True: always; False: never.

    Raises:
        ValueError: bad input, or a search larger than ``max_subsets`` (use :func:`kruskal_sweep`).
    """
    x = validate_vectors(vectors)
    n_vec, d = x.shape
    max_subsets = check_int(max_subsets, "max_subsets")
    pool_rank = int(numerical_rank(x, rtol).rank)
    top = min(pool_rank + 1, n_vec, d)
    worst = sum(math.comb(n_vec, j) for j in range(1, top + 1))
    if worst > max_subsets:
        raise ValueError(
            f"exact Kruskal rank of N = {n_vec} vectors would test up to {worst:,} subsets "
            f"(> max_subsets = {max_subsets:,}); use kruskal_sweep for a sampled estimate"
        )
    x64 = pool64(x)
    gram = x64 @ x64.T  # (N, N)
    chunk = 65536
    bar = progress_bar(progress, large=worst > LARGE_SUBSETS, total=worst, desc="exact Kruskal rank")
    try:
        for k in range(1, top + 1):
            r = resolve_rtol(rtol, k, d, x.dtype)
            combos = itertools.combinations(range(n_vec), k)
            while block := list(itertools.islice(combos, chunk)):
                dec = _test_subsets(x64, torch.tensor(block, dtype=torch.int64), r, gram)
                if bar is not None:
                    bar.update(len(block))
                if bool((dec.rank < k).any()):
                    return k - 1
        return top
    finally:
        if bar is not None:
            bar.close()
