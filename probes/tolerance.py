"""How much a verdict depends on the rank tolerance: critical tolerance, tolerance grid, exact margin.

A k-subset (or a context) is full rank at tolerance t when its ratio r = sigma_k / sigma_1 exceeds t.
The share of full-rank subsets is therefore non-increasing in t, and a verdict "share >= threshold"
flips at exactly one tolerance, the *critical tolerance* c: the verdict holds for every t < c and fails
for every t > c. With M subsets and m = ceil(threshold x M) of them required, c is the m-th largest r.

Nothing here computes a spectrum per subset. Each subset carries an interval for log10(r / rtol): a
factorisation of the fast path at tolerance t (:func:`probes._fast.subset_decisions`) proves either
r > t x 10^margin (full rank, with its certified margin) or r <= t (dependent), and monotonicity does
the rest: a subset full at t is full at every smaller tolerance, a dependent one at every larger. The
grid (default 0.1x to 10x rtol) is filled by deciding, at each grid point, only the subsets whose
interval still straddles it; the critical tolerance is then bracketed from the same intervals and the
bracket narrowed by bisection (again only on the straddling subsets) to a relative width of
``precision``. Every fraction of the grid is what float64 SVD gives on the same subsets, except for a
subset whose ratio lies within float64 rounding of a grid point, which the fast path treats as it
treats any near-threshold subset (see :mod:`probes._fast`).

The smallest margin (decades between the deciding singular value and the threshold, over the tested
subsets) is made exact by branch and bound: subsets are visited in increasing order of their proven
margin bound and given an exact float64 singular-value ratio until no remaining bound is below the
best exact value; when that would take more than ``max_spectra`` spectra the proven bound is
reported instead and ``margin_bound`` says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from probes import _fast
from probes.kruskal import (
    _all_subsets_dependent,
    _check_k,
    _pool_gram,
    all_subsets,
    pool64,
    pool_spectrum,
    sample_subsets,
    validate_vectors,
)
from probes.rank import Array, as_tensor, check_finite, check_int, pow2_rescale, resolve_rtol

DEFAULT_GRID = (0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
PRECISION = 0.05  # relative width the critical-tolerance bracket is narrowed to
_MAX_BISECTIONS = 12
_SLACK = 1e-6  # relative widening of the bracket: float64 rounding of the margins and of 10 ** log10


@dataclass(frozen=True, repr=False)
class ToleranceProfile:
    """How a verdict depends on the rank tolerance.

    Attributes:
        rtol: the tolerance the verdict was given at; threshold: the share required.
        critical_rtol: the tolerance at which the verdict flips (holds below it, fails above it): the
            geometric middle of the proven bracket when it is closed; when it is open, its finite end
            (0.0 when no positive tolerance was proven to pass, inf when no tolerance was proven to fail).
        critical_rtol_low, critical_rtol_high: proven bracket, low <= critical <= high.
        verdict_margin: |log10(critical_rtol / rtol)| in decades: how far the tolerance must move to flip
            the verdict (a bound when the bracket is open).
        rtol_grid: {multiplier of rtol: share of full-rank subsets (contexts) at that tolerance}.
        min_margin: the smallest margin in decades over the subsets (contexts): exact unless
            ``margin_bound`` (then a proven lower bound).
        subsets: subsets (contexts) profiled; passes: factorisation passes run; spectra: exact spectra.
    """

    rtol: float
    threshold: float
    critical_rtol: float
    critical_rtol_low: float
    critical_rtol_high: float
    verdict_margin: float
    rtol_grid: dict[float, float]
    min_margin: float
    margin_bound: bool
    subsets: int
    passes: int
    spectra: int
    seconds: float
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Typed values: floats, the grid as dict[float, float], ``margin_bound`` a bool, counts ints."""
        return {
            "critical_rtol": self.critical_rtol, "critical_rtol_low": self.critical_rtol_low,
            "critical_rtol_high": self.critical_rtol_high, "verdict_margin": self.verdict_margin,
            "rtol_grid": dict(self.rtol_grid), "min_margin": self.min_margin, "margin_bound": self.margin_bound,
        }

    def __repr__(self) -> str:
        kind = "bound" if self.margin_bound else "exact"
        return (f"ToleranceProfile(critical_rtol={self.critical_rtol:.3g} = {self.critical_rtol / self.rtol:.3g}x "
                f"rtol in [{self.critical_rtol_low:.3g}, {self.critical_rtol_high:.3g}], verdict_margin="
                f"{self.verdict_margin:.2f} decades, min_margin={self.min_margin:.2f} decades ({kind}), "
                f"{self.subsets} subsets, {self.passes} passes)")


class _Intervals:
    """Per item: proven log10(r / rtol) > full_to (full rank at every t <= rtol 10^full_to) and
    r <= rtol 10^dep_from (dependent at every t >= rtol 10^dep_from)."""

    def __init__(self, count: int, decide: Callable[[torch.Tensor, float], _fast.Decisions], full_rank: int,
                 all_dependent: Callable[[float], bool]):
        self.full_to = torch.full((count,), -math.inf, dtype=torch.float64)
        self.dep_from = torch.full((count,), math.inf, dtype=torch.float64)
        self.decide, self.full_rank, self.all_dependent = decide, full_rank, all_dependent
        self.passes = 0

    def at(self, log_t: float, rtol: float) -> None:
        """Decide every item still undecided at tolerance rtol 10^log_t."""
        todo = ((self.full_to < log_t) & (self.dep_from > log_t)).nonzero().flatten()
        if not todo.numel():
            return
        t = rtol * 10.0 ** log_t
        if self.all_dependent(t):
            self.dep_from[todo] = log_t
            return
        dec = self.decide(todo, t)
        self.passes += 1
        full = (dec.rank == self.full_rank).cpu()
        margin = torch.nan_to_num(dec.margin.cpu().to(torch.float64), nan=0.0).clamp_min(0.0)
        self.full_to[todo[full]] = torch.maximum(self.full_to[todo[full]], log_t + margin[full])
        self.dep_from[todo[~full]] = torch.minimum(self.dep_from[todo[~full]], torch.tensor(log_t,
                                                                                          dtype=torch.float64))

    def share_full(self, log_t: float) -> float:
        return float((self.full_to >= log_t).double().mean())

    def bracket(self, required: int) -> tuple[float, float]:
        """Proven log10(c / rtol) bracket: at least ``required`` items are full up to ``low``; fewer than
        ``required`` can be full at or beyond ``high``."""
        if required <= 0:
            return math.inf, math.inf
        low = float(self.full_to.sort(descending=True).values[required - 1])
        high = float(self.dep_from.sort(descending=True).values[required - 1])
        return low, high


def _profile(
    count: int, rtol: float, threshold: float, grid: Sequence[float] | None, precision: float,
    decide: Callable[[torch.Tensor, float], _fast.Decisions], full_rank: int, all_dependent: Callable[[float], bool],
    ratios: Callable[[torch.Tensor], torch.Tensor], max_spectra: int, start: float, slack: float,
    note: str = "",
) -> ToleranceProfile:
    iv = _Intervals(count, decide, full_rank, all_dependent)
    multipliers = sorted({float(m) for m in (grid or ())} | {1.0})
    logs = {m: math.log10(m) for m in multipliers}
    order = [1.0] + sorted((m for m in multipliers if m != 1.0), key=lambda m: -abs(logs[m]))
    for m in order:  # the extremes first: what passes at 10x or fails at 0.1x needs no test in between
        iv.at(logs[m], rtol)
    rtol_grid = {m: iv.share_full(logs[m]) for m in multipliers} if grid else {}
    required = math.ceil(threshold * count - 1e-9)
    low, high = iv.bracket(required)
    for _ in range(_MAX_BISECTIONS):
        if not (math.isfinite(low) and math.isfinite(high)) or high - low <= math.log10(1 + precision):
            break
        iv.at((low + high) / 2, rtol)
        low, high = iv.bracket(required)
    min_margin, bound, spectra = _exact_min_margin(iv, ratios, rtol, max_spectra, slack)
    low, high = iv.bracket(required)  # the exact ratios found on the way may close the bracket
    c_low = 0.0 if low == -math.inf else rtol * 10.0 ** low * (1 - _SLACK)
    c_high = math.inf if high == math.inf else rtol * 10.0 ** high * (1 + _SLACK)
    if c_low > 0 and math.isfinite(c_high):
        critical = math.sqrt(c_low * c_high)
    else:
        critical = c_high if c_low == 0 else c_low
    margin_decades = abs(math.log10(critical / rtol)) if 0 < critical < math.inf else math.inf
    return ToleranceProfile(
        rtol=rtol, threshold=threshold, critical_rtol=critical, critical_rtol_low=c_low, critical_rtol_high=c_high,
        verdict_margin=margin_decades, rtol_grid=rtol_grid, min_margin=min_margin, margin_bound=bound,
        subsets=count, passes=iv.passes, spectra=spectra, seconds=time.perf_counter() - start, note=note,
    )


def _exact_min_margin(iv: _Intervals, ratios: Callable[[torch.Tensor], torch.Tensor], rtol: float,
                      max_spectra: int, slack: float) -> tuple[float, bool, int]:
    """Branch and bound on the proven per-item margin bounds at rtol (full: full_to; dependent: -dep_from)."""
    full = iv.full_to >= 0
    bound = torch.where(full, iv.full_to, -iv.dep_from).clamp_min(0.0)
    order = bound.argsort()
    best, spectra, pos = math.inf, 0, 0
    batch = 16
    while pos < order.numel():
        if float(bound[order[pos]]) >= best:
            return best, False, spectra
        if spectra >= max_spectra:
            return min(best, float(bound[order[pos]])), True, spectra
        items = order[pos: pos + min(batch, max_spectra - spectra)]
        r = ratios(items).cpu().to(torch.float64)
        with torch.no_grad():
            exact = torch.where(r > 0, (torch.log10(r.clamp_min(1e-300)) - math.log10(rtol)).abs(),
                                torch.tensor(math.inf, dtype=torch.float64))
        # exact ratios close both ends, up to the float64 error of a singular value (slack x sigma_1)
        below = torch.log10((r - slack).clamp_min(0)) - math.log10(rtol)  # -inf where r <= slack
        above = torch.log10(r + slack) - math.log10(rtol)
        iv.full_to[items] = torch.maximum(iv.full_to[items], below)
        iv.dep_from[items] = torch.minimum(iv.dep_from[items], above)
        best = min(best, float(exact.min()))
        spectra += items.numel()
        pos += items.numel()
    return best, False, spectra


def _check_threshold(threshold: Any) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold <= 1:
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
    return float(threshold)


def _check_grid(grid: Sequence[float] | None) -> tuple[float, ...] | None:
    if grid is None:
        return None
    values = tuple(float(m) for m in grid)
    if not values or not all(0 < m < math.inf for m in values):
        raise ValueError(f"rtol_grid must list positive finite multipliers of rtol (e.g. 0.1, 1, 10); got {grid!r}")
    return values


def kruskal_profile(
    vectors: Array, k: int, *, subsets: int = 5000, seed: int = 0, rtol: float | None = None,
    threshold: float = 0.99, rtol_grid: Sequence[float] | None = DEFAULT_GRID, precision: float = PRECISION,
    max_spectra: int = 64,
) -> ToleranceProfile:
    """Tolerance profile of a Kruskal test on the same subsets :func:`probes.kruskal_test` draws with
    the same ``subsets`` and ``seed`` (every subset when C(N, k) <= subsets).

    Args:
        vectors: (N, d); k: subset size; rtol: the test's tolerance (default ``max(k, d) x eps``).
        threshold: share of full-rank subsets the verdict needs.
        rtol_grid: multipliers of rtol to report the share at (None: no grid).
        precision: relative width of the critical-tolerance bracket sought.
        max_spectra: exact spectra allowed for the exact minimum margin.
    """
    start = time.perf_counter()
    x = validate_vectors(vectors)
    n_vec, d = x.shape
    k = _check_k(k, n_vec)
    subsets = check_int(subsets, "subsets")
    threshold = _check_threshold(threshold)
    grid = _check_grid(rtol_grid)
    rtol = resolve_rtol(rtol, k, d, x.dtype)
    if k > d:  # no k vectors in R^d are independent: the verdict fails at every tolerance
        return ToleranceProfile(rtol=rtol, threshold=threshold, critical_rtol=0.0, critical_rtol_low=0.0,
                                critical_rtol_high=0.0, verdict_margin=math.inf,
                                rtol_grid=dict.fromkeys(grid or (), 0.0), min_margin=math.inf, margin_bound=False,
                                subsets=0, passes=0, spectra=0, seconds=time.perf_counter() - start,
                                note=f"k = {k} > d = {d}")
    total = math.comb(n_vec, k)
    idx = all_subsets(n_vec, k) if total <= subsets else sample_subsets(n_vec, k, subsets, seed)
    x64 = pool64(x)
    gram = _pool_gram(x64)
    spectrum = pool_spectrum(x64)
    lam_cap = float(spectrum[0]) ** 2
    idx_dev = idx.to(x64.device)

    def decide(items: torch.Tensor, t: float) -> _fast.Decisions:
        return _fast.subset_decisions(x64, idx_dev[items.to(x64.device)], t, gram, lam_cap=lam_cap,
                                      exact_dependent=0)

    def ratios(items: torch.Tensor) -> torch.Tensor:
        s = torch.linalg.svdvals(x64[idx_dev[items.to(x64.device)]])  # (b, k) descending
        return s[:, k - 1] / s[:, 0].clamp_min(torch.finfo(torch.float64).tiny)

    return _profile(int(idx.shape[0]), rtol, threshold, grid, precision, decide, k,
                    lambda t: k > 1 and _all_subsets_dependent(x64, k, t, spectrum), ratios, max_spectra, start,
                    _ratio_slack(k, d))


def context_profile(
    contexts: Array, *, rtol: float | None = None, threshold: float = 1.0,
    rtol_grid: Sequence[float] | None = DEFAULT_GRID, precision: float = PRECISION, max_spectra: int = 64,
) -> ToleranceProfile:
    """Tolerance profile of Assumption 2 (every context (n, d) of rank n): the critical tolerance is the
    ``threshold`` quantile of sigma_n / sigma_1 over the contexts (their minimum for threshold 1)."""
    start = time.perf_counter()
    e = as_tensor(contexts, "contexts")
    if e.ndim != 3 or 0 in e.shape:
        raise ValueError(f"contexts must have shape (N, n, d) with N, n, d >= 1; got shape {tuple(e.shape)}")
    check_finite(e, "contexts")
    threshold = _check_threshold(threshold)
    grid = _check_grid(rtol_grid)
    n_ex, n, d = e.shape
    rtol = resolve_rtol(rtol, n, d, e.dtype)
    if n > d:
        return ToleranceProfile(rtol=rtol, threshold=threshold, critical_rtol=0.0, critical_rtol_low=0.0,
                                critical_rtol_high=0.0, verdict_margin=math.inf,
                                rtol_grid=dict.fromkeys(grid or (), 0.0), min_margin=math.inf, margin_bound=False,
                                subsets=n_ex, passes=0, spectra=0, seconds=time.perf_counter() - start,
                                note=f"n = {n} > d = {d}")
    e, _ = pow2_rescale(e, (1, 2))

    def decide(items: torch.Tensor, t: float) -> _fast.Decisions:
        return _fast.matrix_decisions(e[items.to(e.device)], t)

    def ratios(items: torch.Tensor) -> torch.Tensor:
        s = torch.linalg.svdvals(e[items.to(e.device)].to(torch.float64))
        return s[:, n - 1] / s[:, 0].clamp_min(torch.finfo(torch.float64).tiny)

    return _profile(n_ex, rtol, threshold, grid, precision, decide, n, lambda t: False, ratios, max_spectra,
                    start, _ratio_slack(n, d))


def _ratio_slack(k: int, d: int) -> float:
    """Error of a float64 singular value relative to sigma_1 (backward stability, with room)."""
    return 8 * max(k, d) * torch.finfo(torch.float64).eps
