"""How far a verdict is from flipping when the rank tolerance moves, computed beside the verdict.

A k x d matrix X_S (a k-subset of a pool, or one context) is full rank at tolerance t exactly when its
ratio r_S = sigma_k / sigma_1 exceeds t. The share of full-rank matrices is therefore non-increasing in
t, and a verdict "share >= threshold" over M matrices flips at one tolerance, the *critical tolerance*:
with m the number of full-rank matrices the threshold needs, it is the m-th largest r_S. The verdict
holds at every t below it and fails at every t at or above it.

Nothing here needs a spectrum per matrix. Each matrix carries a proven interval lo_S < r_S <= hi_S,
first from the decisions the verdict itself made (a certified margin m proves r > rtol 10^m, and the
test certifies at the grid's top multiplier where that pays, see ``reach`` in
:func:`probes.fast.decide`; a dependent matrix has r <= rtol, or below the proven ceiling that its
dependence proof or its exact spectrum gives it, and the test proves it dependent at the grid's lowest
multiplier first where that pays, see ``dip``; a matrix whose exact spectrum the test computed keeps
the proven floor of that spectrum too), then narrowed only where needed:

- the tolerance grid: at each multiplier (on each side of 1 the extreme first, then the inner points
  by bisection; chunks in parallel on the CPU) the matrices whose interval still contains the grid
  tolerance are decided again by the fast path (:func:`probes.fast.decide`, whose verdicts equal a
  float64 SVD at that tolerance; above rtol, for k <= ``Tuning.eigen_max_k``, the eigenvalues of the
  matrices left instead, whose proven brackets settle every point above rtol at once, and for larger
  k the same for matrices whose interval holds ``Tuning.eigen_span`` or more points, a proven bracket
  of lambda_max computed once per matrix and kept for the later points for the others; below rtol, a
  matrix known dependent gets a ceiling from its rows first, see :meth:`_Refiner._expose`); every
  other matrix is settled by monotonicity. A bound that lies within 1e-9 (relative) of a grid
  tolerance is not trusted: such a matrix is decided again, so float rounding of margins never decides
  a grid point;
- the critical tolerance: a ratio below k x eps(float64) (the float64 rounding of an exactly
  dependent matrix, e.g. duplicated vectors) counts as 0, so such verdicts have critical tolerance 0.0;
  it is bracketed by the m-th largest lower and upper ends, and narrowed by exact spectra, or by shifted
  Cholesky certificates and dependence proofs at tolerances beside an estimate of the m-th ratio, on the
  matrices that can still be the m-th, within fixed work caps, to 3%; a bracket that lies entirely
  beyond 10x rtol (or below rtol / 10, the default grid's ends: the verdict is far from flipping, and the
  bracket says how far) is narrowed the same way to 10%, while at most ``_FAR_SHARE`` times the spectra
  budget can still be the m-th and the bracket lies above the resolution of the Gram route's
  certificates (below it, by exact spectra within the budget alone). A bracket with no upper end yet
  (only the trivial cap: no ratio exceeds 1) gets one from the exact spectra of the matrices likeliest
  to lie lowest. Where more matrices can still be the m-th, they are certified once just below the
  upper end (one factorisation each), provided the certificate proves the known ratios above that level
  (it does not where its bound on lambda_max is loose, as on random Gaussian vectors), and what it
  leaves is narrowed as above; otherwise the bracket is reported as the proven one.
  :func:`critical_is_exact` says whether the result is known to within its bracket's width or only
  bounded by it;
- the smallest margin: branch and bound. Matrices are visited in increasing order of their margin
  bound and given exact float64 spectra (eigenvalues of the Gram matrix, float64 SVD where those are
  not accurate enough) until no bound is below the best exact margin; when that would take more than
  ``max_spectra`` spectra (known after the first batch), the proven bound is reported, flagged
  ``margin_bound``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from probes import fast
from probes.rank import margins_from_singular_values, pow2_rescale

DEFAULT_RTOL_GRID = (0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
BRACKET_WIDTH = 0.03  # relative width of the critical-tolerance bracket sought
FAR_BRACKET_WIDTH = 0.10  # ... and beyond 10x either side of rtol, where the verdict is far from flipping
_PAD = 1e-9  # bounds this close (relative) to a tolerance are not trusted to decide it
_MAX_STEPS = 12  # narrowing steps for the bracket
_SPECTRA_SHARE = 25  # exact spectra: at most 1 / this of the matrices (and at least _MIN_SPECTRA)
_MIN_SPECTRA = 64
_FACTOR_SHARE = 4  # bracket narrowing: at most 1 / this of the matrices factorised again in all ...
_MIN_FACTOR = 1024  # ... or this many, if more
_BATCH = 32
_FAR = 10.0  # a bracket beyond 10x either side of rtol (the default grid's ends) is narrowed to
# FAR_BRACKET_WIDTH while at most _FAR_SHARE times the spectra budget can still set it
_F64_EPS = torch.finfo(torch.float64).eps
ZERO_LEVEL = 2.0**-40  # a critical tolerance 0.0 is exact when its bracket ends below this: 0 to within what
# float64 resolves (k eps for k <= 4096), e.g. duplicated vectors (the ratio, 0 in exact arithmetic, is
# rounding in float64); rows of very different norms can have ratios that small which float64 does resolve
_FAR_SHARE = 2  # a far bracket is narrowed while at most this many times the spectra budget can set it


@dataclass(frozen=True)
class Robustness:
    """How a verdict depends on the rank tolerance (embedded in :class:`probes.KruskalResult` and
    :class:`probes.AssumptionResult` as ``robustness``).

    Attributes:
        margin_bound: True when the result's ``min_margin`` is only a proven lower bound (the exact
            value would have needed more exact spectra than allowed); False when it is exact.
        critical_rtol: the tolerance at which the verdict flips: it holds at every rtol below and fails
            at every rtol at or above. 0.0 when it fails at every tolerance float64 resolves (the bracket
            then ends below :data:`ZERO_LEVEL`: duplicated or zero vectors), inf when it holds at every
            rtol in (0, 1). Known up to the bracket width (3% near rtol, 10% beyond 10x either side)
            where :meth:`exact`; NaN where only the bracket is known (the work caps were reached).
        critical_rtol_low, critical_rtol_high: a proven bracket: low <= critical <= high.
        verdict_margin: how far, in decades, the tolerance must move to flip the verdict:
            |log10(critical_rtol / rtol)| where the critical tolerance is known (inf when it never
            flips), else the proven distance from rtol to the bracket (0 when rtol lies inside it).
        rtol_grid: {multiplier of rtol: fraction at multiplier x rtol}, exactly the fraction a float64
            SVD gives at that tolerance; None when not asked for.

    Without a tolerance analysis (``robustness=False``) the four numbers are NaN and ``rtol_grid`` None.
    """

    margin_bound: bool = True
    critical_rtol: float = math.nan
    critical_rtol_low: float = math.nan
    critical_rtol_high: float = math.nan
    verdict_margin: float = math.nan
    rtol_grid: dict[float, float] | None = None

    def exact(self, rtol: float) -> bool | None:
        """Whether ``critical_rtol`` is known to within its bracket's width (:func:`critical_is_exact`);
        None without one."""
        return critical_is_exact(self.critical_rtol, self.critical_rtol_low, self.critical_rtol_high, rtol)

    def fields(self) -> dict[str, Any]:
        """The fields as a flat dict, in declaration order (the columns of a result row)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def check_robustness(value: Any) -> bool | str:
    """Validate ``robustness``: True, False (also NumPy booleans) or ``"exact"`` (no work caps)."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if value == "exact":
        return "exact"
    raise ValueError(f"robustness must be True, False or 'exact', got {value!r}")


def check_rtol_grid(grid: Any) -> tuple[float, ...] | None:
    """Validate ``rtol_grid``: None (no grid) or a non-empty sequence of positive finite multipliers."""
    if grid is None:
        return None
    bad = (
        "rtol_grid must be None or a list of positive finite multipliers of rtol (e.g. (0.1, 1, 10)), "
        f"got {grid!r}"
    )
    if isinstance(grid, str | bytes | numbers.Number):
        raise ValueError(bad)
    try:
        values = [float(m) for m in grid if not isinstance(m, bool | np.bool_)]
    except (TypeError, ValueError):
        raise ValueError(bad) from None
    if not values or len(values) != len(list(grid)) or not all(0 < m < math.inf for m in values):
        raise ValueError(bad)
    return tuple(sorted(set(values)))


def required_count(threshold: float, total: int) -> int:
    """The fewest full-rank matrices of ``total`` for which ``count / total >= threshold`` (as a float
    comparison, exactly as the verdict is taken)."""
    need = max(1, min(total, math.ceil(threshold * total)))
    while need > 1 and (need - 1) / total >= threshold:
        need -= 1
    while need < total and need / total < threshold:
        need += 1
    return need


def critical_rank(threshold: float, total: int) -> int:
    """q: the critical tolerance of a verdict at ``threshold`` over ``total`` matrices is their q-th
    smallest ratio (with fewer than the required count above it, the verdict fails)."""
    return total - required_count(threshold, total) + 1


def critical_quantile(threshold: float, total: int) -> float:
    """:func:`critical_rank` as a quantile of the ratios: the q-th smallest is the ((q - 1) / (total -
    1))-quantile."""
    return (critical_rank(threshold, total) - 1) / (total - 1) if total > 1 else 0.0


def verdict_distance(critical: float, rtol: float, low: float | None = None,
                     high: float | None = None) -> float:
    """|log10(critical / rtol)| in decades; inf where the verdict never flips (critical 0 or inf). Where
    the critical tolerance is unknown (NaN), the proven distance from rtol to the bracket [low, high]
    (0 when rtol lies inside it)."""
    if math.isnan(critical) and low is not None and high is not None:
        if rtol < low:
            return math.log10(low / rtol)
        return math.log10(rtol / high) if 0 < high < rtol else 0.0
    if not 0 < critical < math.inf or rtol <= 0:
        return math.inf
    return abs(math.log10(critical / rtol))


def critical_is_exact(critical: float, low: float, high: float, rtol: float) -> bool | None:
    """Whether a critical tolerance is known (``True``: to within its bracket's width, 3% near rtol and
    10% beyond 10x either side, or proven 0 / inf) or only bounded by its bracket (``False``: the work
    caps were reached; ``critical`` is then NaN, or, from older results, the bracket end nearer to rtol);
    None when there is no bracket (NaN)."""
    values = (low, high, rtol)
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return None
    if critical is None or math.isnan(float(critical)):
        return False
    critical, low, high, rtol = map(float, (critical, low, high, rtol))
    if critical == 0.0 and high <= ZERO_LEVEL or critical == math.inf:
        return True
    if not low > 0:
        return False
    far = low >= rtol * _FAR or high <= rtol / _FAR
    return high <= low * (1 + (FAR_BRACKET_WIDTH if far else BRACKET_WIDTH)) * (1 + _PAD)


def trivial(grid: tuple[float, ...] | None) -> Robustness:
    """No matrix can be full rank (k > d): fails at every tolerance."""
    return Robustness(margin_bound=False, critical_rtol=0.0, critical_rtol_low=0.0, critical_rtol_high=0.0,
                      verdict_margin=math.inf, rtol_grid=None if grid is None else dict.fromkeys(grid, 0.0))


def margin_summary(dec: fast.Decisions) -> tuple[float, bool]:
    """The verdict's own smallest margin over matrices with a known rank, and whether a certified
    lower bound (rather than an exact margin) sets it."""
    known = (dec.rank >= 0) & ~dec.margin.isnan()
    if not bool(known.any()):
        return math.nan, False
    margins = dec.margin[known]
    low = float(margins.min())
    bound = dec.bound[known] if dec.bound is not None else torch.ones_like(margins, dtype=torch.bool)
    return low, bool(bound.any()) and float(margins[bound].min()) <= low


@dataclass
class Matrices:
    """Where the matrices come from: ``gram(pos)`` (c, k, k) float64 Gram blocks of the matrices at
    positions ``pos`` (a fresh tensor or a buffer valid until the next call), ``rows(pos)`` their
    (c, k, d) float64 rows (a :class:`probes.fast.Rows`, or a plain callable, which is wrapped in one);
    ``lam_cap`` bounds every lambda_max (or None)."""

    count: int
    k: int
    width: int
    gram: Callable[[torch.Tensor], torch.Tensor]
    rows: fast.Rows | Callable[[torch.Tensor], torch.Tensor]
    lam_cap: float | None = None
    step: int = 256
    device: torch.device | None = None
    certify32: Callable[[torch.Tensor, float], torch.Tensor] | None = None  # (pos, t) -> r > t proven
    svd_only: torch.Tensor | None = None  # (count,) bool: matrices whose ``gram`` the Gram route cannot
    # take (subsets of tiny rows, see :func:`probes.kruskal.tiny_rows`): decided by the SVD of their rows

    def __post_init__(self) -> None:
        self.rows = fast.Rows.of(self.rows)
        if self.svd_only is not None:
            self.svd_only = self.svd_only.cpu()


class _Refiner:
    """Proven intervals lo < r <= hi of every matrix's ratio r = sigma_k / sigma_1, and the tools that
    narrow them (all on the CPU copy of the intervals; the matrices stay on their device)."""

    def __init__(self, src: Matrices, dec: fast.Decisions, rtol: float):
        self.src, self.rtol = src, rtol
        rank, margin = dec.rank.cpu(), dec.margin.cpu().to(torch.float64)
        bound = dec.bound.cpu() if dec.bound is not None else torch.ones_like(rank, dtype=torch.bool)
        full = rank == src.k
        self.lo = torch.zeros(src.count, dtype=torch.float64)
        self.hi = torch.ones(src.count, dtype=torch.float64)
        certified = full & bound & torch.isfinite(margin)
        self.lo[full] = rtol
        self.lo[certified] = torch.maximum(self.lo[certified], rtol * 10.0 ** margin[certified] * (1 - _PAD))
        self.hi[~full] = rtol
        if dec.floor is not None:  # proven lower ends from the exact spectra the test computed
            floor = dec.floor.cpu().to(torch.float64) * (1 - _PAD)
            usable = (floor > self.lo) & (full | (floor < self.hi))
            self.lo = torch.where(usable, floor, self.lo)
        if dec.ceiling is not None:  # proven ceilings (shortcut proofs, exact spectra)
            ceiling = dec.ceiling.cpu().to(torch.float64) * (1 + _PAD)
            usable = (ceiling < self.hi) & (~full | (ceiling > self.lo))
            self.hi = torch.where(usable, ceiling, self.hi)
        self.fraction = float(full.double().mean())
        self.ratio = torch.full((src.count,), math.nan, dtype=torch.float64)  # exact where computed
        if dec.floor is not None and dec.ceiling is not None:  # (spectra whose band is within 1e-6)
            floor, ceiling = dec.floor.cpu().to(torch.float64), dec.ceiling.cpu().to(torch.float64)
            tight = (floor > 0) & (ceiling <= floor * (1 + 1e-6))
            self.ratio[tight] = (floor[tight] * ceiling[tight]).sqrt()
        # proven brackets of lambda_max (NaN: not computed), kept between the grid points above rtol
        self.lam_lo = torch.full((src.count,), math.nan, dtype=torch.float64)
        self.lam_hi = torch.full((src.count,), math.nan, dtype=torch.float64)
        self.bracketed = torch.zeros(src.count, dtype=torch.bool)  # eigenvalues computed (:meth:`exact`)
        self.charged = torch.zeros(src.count, dtype=torch.bool)  # charged to the spectra budget
        self.dep_margin = torch.full((src.count,), math.nan, dtype=torch.float64)  # exact, from an SVD
        self.factorised = 0
        self.above: list[float] = []  # the grid's tolerances above rtol (set by :meth:`grid`) ...
        self.below: list[float] = []  # ... and below it

    # ------------------------------------------------------------------ the tools
    @property
    def spectra(self) -> int:
        """Exact spectra charged to the budget of the bracket and the margin (each matrix once)."""
        return int(self.charged.sum())

    def _workers(self) -> int:
        """Worker threads for independent chunks: the fast path's, on the CPU; one elsewhere."""
        return fast.workers() if _device(self.src).type == "cpu" else 1

    def _chunks(self, pos: torch.Tensor):
        for a in range(0, pos.numel(), self.src.step):
            yield pos[a : a + self.src.step]

    def decide_at(self, pos: torch.Tensor, t: float) -> None:
        """Exact decisions at tolerance t (the fast path's stages 1 to 3), certifying at the plain shift
        (margin floor 0: no margin bounds): float32 certificates first while they pay, then float64
        chunks on the worker threads of the fast path. Whether the dependence proof goes first is
        decided from the first chunk (as the fast path's planner does)."""
        pos = self._settle(pos)
        if 0 < t < self.rtol and self.src.k > 1:
            pos = self._expose(pos, t)
            if not pos.numel():
                return
        if self.src.certify32 is not None and t > 0:
            # float32 certificates while they pay (at least half of a chunk certified)
            rest, use32 = [], True
            for part in self._chunks(pos):
                if not use32:
                    rest.append(part)
                    continue
                ok = self.src.certify32(part.to(_device(self.src)), t).cpu()
                self.lo[part[ok]] = torch.maximum(self.lo[part[ok]], torch.tensor(t, dtype=torch.float64))
                rest.append(part[~ok])
                use32 = bool(ok.double().mean() >= 0.5)
            pos = torch.cat(rest) if rest else pos
        parts = list(self._chunks(pos))
        if not parts:
            return
        eigen = self._eigen_first(pos, t)
        if eigen.numel():
            # every matrix left is full rank at rtol (hi <= rtol for the others): eigenvalue brackets
            # (no SVD) settle this point and the other points above rtol, except for the rare matrix
            # whose bracket contains t
            self.exact(eigen, count=False, svd=False)
            self.factorised += eigen.numel()
            pos = pos[(self.lo[pos] < t * (1 + _PAD)) & (self.hi[pos] > t * (1 - _PAD))]
            parts = list(self._chunks(pos))
            if not parts:
                return
        first = self._decide_part(parts[0], t, dependent_first=False)
        dec = first[0]
        dependent = dec.stages["cholesky_dependent"]
        tune = fast.tuning.TUNING  # (the fast path's planner rule at a floor)
        dependent_first = (dependent > tune.dependent_first_floor * parts[0].numel()
                           and dec.shortcut < dependent * tune.dependent_first_settled)
        results = [first] + fast.map_chunks(lambda j: self._decide_part(parts[j + 1], t, dependent_first),
                                             len(parts) - 1, self._workers())
        for part, (dec, lo, lam) in zip(parts, results, strict=True):
            if lam is not None:
                self.lam_lo[part], self.lam_hi[part] = lam
            full = dec.rank.cpu() == self.src.k
            self.lo[part[full]] = torch.maximum(self.lo[part[full]], lo[full])
            self.hi[part[~full]] = torch.minimum(self.hi[part[~full]], torch.tensor(t, dtype=torch.float64))
        self.factorised += pos.numel()

    def _expose(self, pos: torch.Tensor, t: float) -> torch.Tensor:
        """Below rtol, the matrices known dependent whose ceiling still lies above t get one from the rows
        (:func:`probes.fast.kernels.exposed_ceilings` at the shift t^2 lam_lo, lam_lo <= lambda_max from
        power steps): one factorisation, where the test's proof left a vector that bounds the ratio
        only by about rtol and t lies near the Gram route's resolution (there a proof at t fails, and
        the fast path would end in exact spectra). The first chunk goes alone: where it leaves more than
        ``Tuning.expose_pays`` of its matrices undecided at t (they are full rank there: the verdict's
        dependence lies between t and rtol), the others are left to the decisions. Returns the
        matrices t still has to decide."""
        dep = pos[self.hi[pos] <= self.rtol * (1 + _PAD)]
        if not dep.numel():
            return pos
        parts = list(self._chunks(dep))

        def ceilings(j: int) -> torch.Tensor:
            dev = parts[j].to(_device(self.src))
            gram = self.src.gram(dev)  # (c, k, k)
            shift = t**2 * fast.kernels.power_lower(gram)
            return fast.kernels.exposed_ceilings(gram, shift, self.src.width,
                                                 rows=self.src.rows.at(dev)).cpu()

        def keep(part: torch.Tensor, ceil: torch.Tensor) -> None:
            self.hi[part] = torch.minimum(self.hi[part], torch.maximum(ceil * (1 + _PAD), self.lo[part]))

        keep(parts[0], ceilings(0))
        open_share = float((self.hi[parts[0]] > t * (1 - _PAD)).double().mean())
        if len(parts) > 1 and open_share <= fast.tuning.TUNING.expose_pays:
            rest = fast.map_chunks(lambda j: ceilings(j + 1), len(parts) - 1, self._workers())
            for part, ceil in zip(parts[1:], rest, strict=True):
                keep(part, ceil)
        return pos[(self.lo[pos] < t * (1 + _PAD)) & (self.hi[pos] > t * (1 - _PAD))]

    def _eigen_first(self, pos: torch.Tensor, t: float) -> torch.Tensor:
        """The matrices at ``pos`` that get eigenvalue brackets at a grid point t instead of
        factorisations. Above rtol: every one up to ``Tuning.eigen_max_k``; above it, those whose
        interval still holds ``Tuning.eigen_span`` or more grid tolerances above rtol (t included), each
        of which would otherwise take a certificate and often a dependence proof, beside a lambda_max
        bracket. Below rtol, up to ``Tuning.eigen_max_k``: those whose interval holds that many grid
        tolerances below rtol (what the dependence proofs left: matrices dependent at rtol but full rank
        at some of those points, each of which would otherwise take a failed proof and a certificate)."""
        tune = fast.tuning.TUNING
        if not pos.numel() or t == self.rtol:
            return pos[:0]
        if t > self.rtol:
            if self.src.k <= tune.eigen_max_k:
                return pos
            points = [p for p in self.above if p <= t]
        elif self.src.k <= tune.eigen_max_k:
            points = self.below
        else:
            return pos[:0]
        points = torch.tensor(points, dtype=torch.float64)  # (P,)
        lo, hi = self.lo[pos, None], self.hi[pos, None]  # (n, 1)
        span = ((lo < points * (1 + _PAD)) & (hi > points * (1 - _PAD))).sum(-1)  # (n,)
        return pos[span >= tune.eigen_span]

    def _decide_part(self, part: torch.Tensor, t: float, dependent_first: bool):
        """(decisions at t, proven lower ends, lambda_max brackets or None) for the matrices at ``part``.
        Above rtol for k > ``Tuning.eigen_max_k`` (where the eigenvalues would cost more), lambda_max is
        bracketed once per matrix (power steps, then one factorisation of mu I - G proving the upper end, see
        :func:`probes.fast.tight_lambda_max`) and the bracket serves every later point above rtol:
        with the loose usual bounds a matrix whose ratio lies a few times above t fails the certificate,
        and is then proven, bracketed and certified again at each point."""
        dev = part.to(_device(self.src))
        gram = self.src.gram(dev)
        lam = None
        if t > self.rtol and self.src.k > fast.tuning.TUNING.eigen_max_k:
            lam_lo, lam_hi = self.lam_lo[part], self.lam_hi[part]
            new = lam_lo.isnan()
            if bool(new.any()):
                pos = new.nonzero().flatten().to(gram.device)
                lo, hi = fast.tight_lambda_max(gram if bool(new.all()) else gram[pos], residual=True)
                lam_lo[new], lam_hi[new] = lo.cpu(), hi.cpu()
            lam = (lam_lo, lam_hi)
        dec = fast.decide(
            gram,
            self.src.rows.at(dev),
            t,
            self.src.width,
            lam_cap=self.src.lam_cap,
            exact_dependent=0 if self.src.k > 1 else None,
            dependent_first=dependent_first,
            floor=0.0,
            lam_bounds=None if lam is None else (lam[0].to(gram.device), lam[1].to(gram.device)),
        )
        full = dec.rank.cpu() == self.src.k
        margin = dec.margin.cpu().to(torch.float64)
        lo = torch.full((part.numel(),), t, dtype=torch.float64)
        cert = full & dec.bound.cpu() & torch.isfinite(margin)
        lo[cert] = torch.maximum(lo[cert], t * 10.0 ** margin[cert] * (1 - _PAD))
        return dec, lo, lam

    def test_at(self, pos: torch.Tensor, t: float) -> None:
        """Proofs only (no spectra): a shifted Cholesky factorisation proves r > t, a failing one at the
        dependence shift proves r < t; matrices neither proves keep their interval."""
        k, width = self.src.k, self.src.width
        for part in self._chunks(self._settle(pos)):
            dev = part.to(_device(self.src))
            gram = self.src.gram(dev)
            lam_hi = self._lam_hi(part, gram)
            c = part.numel()
            ok, _, _ = fast.floor_certificate(gram, lam_hi, t, width, 0.0)
            ok = ok.cpu()
            self.lo[part[ok]] = torch.maximum(self.lo[part[ok]], torch.tensor(t, dtype=torch.float64))
            rest = (~ok).nonzero().flatten()
            if rest.numel() and k > 1:
                here = rest.to(gram.device)
                dep, ceil = fast.prove_dependent(
                    gram[here],
                    lam_hi[here],
                    t,
                    width,
                    ceilings=True,
                    rows=self.src.rows.at(dev[here]),
                )
                dep, ceil = (
                    dep.cpu(),
                    torch.minimum(ceil.cpu() * (1 + _PAD), torch.tensor(t, dtype=torch.float64)),
                )
                hit = part[rest[dep]]
                self.hi[hit] = torch.minimum(self.hi[hit], ceil[dep])
            self.factorised += c

    def _settle(self, pos: torch.Tensor) -> torch.Tensor:
        """The matrices at ``pos`` that only the SVD of their rows can decide (``Matrices.svd_only``) get
        their exact ratio; returns the others."""
        if self.src.svd_only is None or not pos.numel():
            return pos
        only = self.src.svd_only[pos]
        if not bool(only.any()):
            return pos
        todo = pos[only & self.ratio[pos].isnan()]
        if todo.numel():
            self.exact(todo, count=False)
        return pos[~only]

    def exact(self, pos: torch.Tensor, *, count: bool = True, svd: bool = True) -> None:
        """Exact ratios: eigenvalues of the Gram matrix with a proven error band, float64 SVD of the
        rows where the band is wider than 1e-6 (relative). Chunks run on the fast path's worker threads
        on the CPU. ``count``: charge them to the spectra budget of the bracket and the margin;
        ``svd`` False: no SVD, the eigenvalues' proven bracket only (the ratio stays unknown where the
        bracket is wider). Matrices whose eigenvalues were computed before get only the SVD, where still
        needed; a matrix is charged to the budget once."""
        done = self.bracketed[pos]
        if self.src.svd_only is not None:  # (no Gram block to read: the SVD alone)
            done = done | self.src.svd_only[pos]
            svd = svd or bool(self.src.svd_only[pos].any())
        jobs = [(part, False) for part in self._chunks(pos[~done])]  # (positions, the SVD alone)
        if svd:
            jobs += [(part, True) for part in self._chunks(pos[done & self.ratio[pos].isnan()])]

        def run(j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            part, svd_only = jobs[j]
            return self._svd_ratios(part) if svd_only else self._spectra(part, svd)

        results = fast.map_chunks(run, len(jobs), self._workers())
        for (part, _), (r, r_lo, r_hi) in zip(jobs, results, strict=True):
            self.ratio[part] = torch.where(r.isnan(), self.ratio[part], r)
            self.lo[part] = torch.maximum(self.lo[part], r_lo * (1 - _PAD))
            self.hi[part] = torch.minimum(self.hi[part], torch.maximum(r_hi * (1 + _PAD), self.lo[part]))
        self.bracketed[pos] = True
        if count:
            self.charged[pos] = True

    def _spectra(
        self, part: torch.Tensor, svd: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(r, r_lo, r_hi) on the CPU for the matrices at ``part``, r NaN where not known (see
        :meth:`exact`)."""
        tiny = torch.finfo(torch.float64).tiny
        dev = part.to(_device(self.src))
        gram = self.src.gram(dev)
        lam_hi = fast.lam_hi_bound(gram, self.src.lam_cap)
        err = 2 * fast.gram_error(gram, lam_hi, self.src.width)
        lam = fast.threads.spread(fast.threads.eigvalsh, gram)  # (c, k) ascending
        lmin, lmax = lam[:, 0].clamp(min=0), lam[:, -1]
        r = (lmin / lmax.clamp(min=tiny)).sqrt()
        r_lo = ((lmin - err).clamp(min=0) / (lmax + err).clamp(min=tiny)).sqrt()  # (0 / 0 for a zero matrix)
        r_hi = ((lmin + err) / (lmax - err).clamp(min=tiny)).sqrt()
        loose = ~(r_hi <= r_lo * (1 + 1e-6)) | (lmax <= 0)
        r_lo, r_hi = r_lo.nan_to_num(0.0), r_hi.nan_to_num(1.0)  # (never NaN: a bound that says nothing)
        if not svd:
            r[loose] = math.nan
        elif bool(loose.any()):
            sr = self._svd_ratios(part[loose.cpu()])[0].to(r.device)
            r[loose], r_lo[loose], r_hi[loose] = sr, sr, sr
        return r.cpu(), r_lo.cpu(), r_hi.cpu()

    def _svd_ratios(self, part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(r, r, r) on the CPU: sigma_k / sigma_1 by the float64 SVD of the rows of the matrices at
        ``part`` (0 for a zero matrix)."""
        k, tiny = self.src.k, torch.finfo(torch.float64).tiny
        rows, _ = pow2_rescale(self.src.rows(part.to(_device(self.src))), (-2, -1))  # (each at its own scale)
        sv = fast.threads.spread(torch.linalg.svdvals, rows)  # (h, k)
        sr = torch.where(sv[:, 0] > 0, sv[:, k - 1] / sv[:, 0].clamp(min=tiny), 0.0).cpu()
        return sr, sr, sr

    # ------------------------------------------------------------------ the answers
    def grid(self, multipliers: tuple[float, ...]) -> dict[float, float]:
        """{multiplier: share full rank at multiplier x rtol}, exact (see the module docstring)."""
        self.above = [m * self.rtol for m in multipliers if m > 1 and m * self.rtol < 1]
        self.below = [m * self.rtol for m in multipliers if m < 1]
        for m in _grid_order(multipliers):
            t = m * self.rtol
            if t >= 1 or m == 1:
                continue  # no ratio exceeds 1: nothing is full rank there; at rtol the verdict decided
            todo = ((self.lo < t * (1 + _PAD)) & (self.hi > t * (1 - _PAD))).nonzero().flatten()
            if todo.numel():
                self.decide_at(todo, t)
        return {float(m): self.fraction if m == 1 else
                float((self.lo >= m * self.rtol).double().mean()) if m * self.rtol < 1 else 0.0
                for m in multipliers}

    def critical(self, threshold: float, max_spectra: int, max_factorised: int) -> tuple[float, float, float]:
        """(critical_rtol, low, high): the m-th largest ratio and a proven bracket around it."""
        total = self.src.count
        q = critical_rank(threshold, total)  # the critical value is the q-th smallest ratio
        toggle = sought = swept = False
        self.factorised = 0  # the grid's decisions do not count against the cap
        for _ in range(_MAX_STEPS):
            a = float(self.lo.kthvalue(q).values)
            b = float(self.hi.kthvalue(q).values)
            far = a >= self.rtol * _FAR or b <= self.rtol / _FAR
            width = FAR_BRACKET_WIDTH if far else BRACKET_WIDTH
            if a >= 1 or (a > 0 and b <= a * (1 + width)):
                break
            if b <= self.src.k * _F64_EPS:
                break  # below float64 resolution: dependent at every resolvable rtol
            open_ = ((self.hi > a) & (self.lo < b) & self.ratio.isnan()).nonzero().flatten()
            if not open_.numel():
                break
            # certificates and dependence proofs of the Gram route narrow the bracket only above their
            # resolution; below it, exact spectra (SVD) alone do
            resolved = b > 2 * _resolution(self.src.k, self.src.width)
            if far and (open_.numel() > _FAR_SHARE * max_spectra or not resolved):
                # far from flipping (beyond the grid's ends), and too many matrices to narrow cheaply (or
                # below the Gram route's resolution): exact spectra within the budget, else the proven
                # bracket
                if self.spectra + open_.numel() <= max_spectra:
                    self.exact(open_)
                    continue
                # no upper end yet, or one above the grid from a few spectra only (the aim of the test,
                # see :func:`probes.fast.subset_decisions`, which some matrices failed): seek the lowest
                seek = b >= 1 or (a >= self.rtol * _FAR and not sought)
                if seek and self._upper_end(open_, q, max_spectra):
                    sought = True
                    continue
                if resolved and b < 1 and not swept:
                    # once, where the certificate is tight enough: certify every matrix whose lower end
                    # still lies below the level that would close the bracket, at that level (what is
                    # left is few enough for spectra)
                    swept = True
                    t = b / (1 + 0.9 * width)
                    if self._certificate_pays(t, width):
                        self.test_at(open_[self.lo[open_] < t], t)
                        continue
                if swept:
                    below = open_[self.lo[open_] < b / (1 + width)]  # (what keeps the lower end down)
                    if below.numel() and below.numel() <= max(max_spectra - self.spectra, _BATCH):
                        self.exact(below)  # the few the sweep left (beyond the budget if need be)
                        continue
                break
            if self.spectra + open_.numel() <= max_spectra:
                self.exact(open_)
                continue
            if self.factorised + open_.numel() > max_factorised:
                if b >= 1:
                    self._upper_end(open_, q, max_spectra)
                break
            # estimate the q-th value from a few exact spectra of the open matrices, then test beside it
            sample = open_[torch.linspace(0, open_.numel() - 1, min(16, open_.numel())).long().unique()]
            sample = sample[self.ratio[sample].isnan()]
            if sample.numel() and self.spectra + sample.numel() <= max_spectra:
                self.exact(sample)
            inside = self.ratio[open_]
            inside = inside[~inside.isnan()]
            below = int((self.hi <= a).sum())
            if inside.numel():
                p = min(1.0, max(0.0, (q - below) / max(1, open_.numel())))
                est = float(inside.quantile(p))
            else:
                est = math.sqrt(a * b) if a > 0 else b / 10
            toggle = not toggle
            t = est * (1 - width / 3) if toggle else est * (1 + width / 3)
            if not a < t < b:
                t = math.sqrt(a * b) if a > 0 else b / 10
            self.test_at(open_, t)
        a = float(self.lo.kthvalue(q).values)
        b = float(self.hi.kthvalue(q).values)
        if a >= 1:
            return math.inf, a, b
        if b <= self.src.k * _F64_EPS:  # below float64 resolution: dependent at every resolvable rtol
            # (the bracket still holds the q-th ratio, e.g. 1e-90 of rows 1e-90 apart)
            return (0.0 if b <= ZERO_LEVEL else math.nan), 0.0, b
        far = a >= self.rtol * _FAR or b <= self.rtol / _FAR
        if a > 0 and b <= a * (1 + (FAR_BRACKET_WIDTH if far else BRACKET_WIDTH)):
            return math.sqrt(a * b), a, b
        return math.nan, a, b  # (a wide bracket: only the bracket is known)

    def _certificate_pays(self, t: float, width: float) -> bool:
        """Whether the certificate at t proves full rank the matrices whose exact ratio lies clearly
        above it (the highest ``_BATCH`` of those known, if they lie ``width`` or more above t): False
        where its bound on lambda_max is too loose (random Gaussian pools, 2-3x) and certifying every
        open matrix at t would settle nothing."""
        known = (self.ratio >= t * (1 + width)) & ~self.ratio.isnan()
        if self.src.svd_only is not None:
            known &= ~self.src.svd_only
        known = known.nonzero().flatten()
        if not known.numel():
            return False
        pos = known[self.ratio[known].argsort(descending=True, stable=True)][:_BATCH]
        return all(bool(self._certified(part, t).all()) for part in self._chunks(pos))

    def _certified(self, part: torch.Tensor, t: float) -> torch.Tensor:
        """(c,) bool on the CPU: the shifted Cholesky certificate proves r > t (c <= the chunk step)."""
        gram = self.src.gram(part.to(_device(self.src)))
        return fast.floor_certificate(gram, self._lam_hi(part, gram), t, self.src.width, 0.0)[0].cpu()

    def _lam_hi(self, part: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
        """(c,) the certificates' bound on lambda_max: the usual one, or the proven bracket kept above
        rtol where tighter."""
        lam_hi = fast.lam_hi_bound(gram, self.src.lam_cap)
        known = self.lam_hi[part].to(gram.device)  # (NaN: none)
        return torch.where(known < lam_hi, known, lam_hi)

    def _upper_end(self, open_: torch.Tensor, q: int, max_spectra: int) -> bool:
        """No upper end yet (only the trivial cap): the exact spectra of the matrices likeliest to lie
        lowest, as many as the spectra budget has room for (False when that is fewer than q)."""
        room = max_spectra - self.spectra
        if room < q:
            return False
        self.exact(open_[self.lo[open_].argsort(stable=True)][:room])
        return True

    def min_margin(self, dec: fast.Decisions, max_spectra: int, max_factorised: float) -> tuple[float, bool]:
        """The exact smallest margin over matrices with a known rank at rtol, or a proven lower bound
        (second value True) when more than ``max_spectra`` spectra would be needed after one
        certificate per candidate at the best exact margin (where there are at most ``max_factorised``
        candidates)."""
        rank, margin = dec.rank.cpu(), dec.margin.cpu().to(torch.float64)
        known = (rank >= 0) & ~margin.isnan()
        if not bool(known.any()):
            return math.nan, False
        bound = known & (dec.bound.cpu() if dec.bound is not None else torch.ones_like(known))
        full = rank == self.src.k
        dependent = bound & ~full  # (a margin the eigenvalues did not resolve: its SVD gives it exactly)
        log_rtol = math.log10(self.rtol) if self.rtol > 0 else -math.inf
        unresolved = math.inf  # the smallest such bound left as a bound: k x d SVDs cost too much beyond
        if self.src.k > fast.tuning.TUNING.eigen_max_k and bool(dependent.any()):  # Tuning.eigen_max_k
            unresolved, dependent = float(margin[dependent].min()), torch.zeros_like(dependent)

        def exact_margins() -> torch.Tensor:  # exact margins where known (inf elsewhere)
            out = torch.where(known & ~bound, margin, math.inf)
            out = torch.where(dependent & ~self.dep_margin.isnan(), self.dep_margin, out)
            have = bound & full & ~self.ratio.isnan() & (self.ratio > 0)
            return torch.where(have, torch.log10(self.ratio.clamp(min=1e-300)) - log_rtol, out)

        def resolve(pos: torch.Tensor, svd: bool = True) -> None:  # exact margins at pos
            dep = dependent[pos]
            if bool(dep.any()):
                self._dependent_margins(pos[dep])
            if not bool(dep.all()):
                self.exact(pos[~dep], svd=svd)

        certified = False
        while True:
            ex = exact_margins()
            best = float(ex.min())
            open_ = bound & full & self.ratio.isnan()
            lb = torch.where(open_, torch.log10(self.lo.clamp(min=1e-300)) - log_rtol, math.inf)
            lb = torch.where(dependent & self.dep_margin.isnan(), margin, lb)
            candidates = (lb < best).nonzero().flatten()
            if not candidates.numel():
                return (best, False) if best <= unresolved else (unresolved, True)
            paid = candidates[self.bracketed[candidates] & self.charged[candidates] & ~dependent[candidates]]
            if paid.numel():  # (their eigenvalues were charged: the SVD completes their spectra)
                self.exact(paid)
                continue
            if certified and candidates.numel() <= _BATCH:
                resolve(candidates)  # (the few the certificates left: beyond the budget if need be)
                continue
            if self.spectra >= max_spectra or (math.isfinite(best) and
                                               self.spectra + candidates.numel() > max_spectra):
                if math.isfinite(best) and not certified and candidates.numel() <= max_factorised:
                    # a few candidates (e.g. subsets that failed the aim of the test, see
                    # :func:`probes.fast.subset_decisions`, certified only at a lower level): one
                    # certificate each at the best exact ratio; what it proves above cannot be the
                    # smallest. (Not where most matrices are candidates, as contexts with their loose
                    # certified margins: a factorisation each for little.)
                    certified = True
                    t = self.rtol * 10.0**best * (1 + _PAD)  # (a lower end at t then lies above best)
                    if self._certificate_pays(t, FAR_BRACKET_WIDTH):  # (not where its bound is loose)
                        self.test_at(candidates[~dependent[candidates]], t)
                        continue
                # (once one exact margin is known, more candidates than spectra left: not worth trying)
                return min(best, float(lb[candidates].min()), unresolved), True
            order = candidates[lb[candidates].argsort(stable=True)]
            batch = order[: min(_BATCH, max_spectra - self.spectra)]
            # eigenvalue brackets first: their lower ends settle most candidates for a fraction of an SVD
            fresh = batch[~self.bracketed[batch] & ~dependent[batch]]
            if bool(dependent[batch].any()):
                resolve(batch[dependent[batch]])
            if fresh.numel() or not bool(dependent[batch].all()):
                resolve(fresh if fresh.numel() else batch[~dependent[batch]], svd=not fresh.numel())

    def _dependent_margins(self, pos: torch.Tensor) -> None:
        """Exact margins of the dependent matrices at ``pos`` from the float64 SVD of their rows (each at
        its own scale), charged to the spectra budget."""
        for part in self._chunks(pos):
            rows, _ = pow2_rescale(self.src.rows(part.to(_device(self.src))), (-2, -1))
            sv = fast.threads.spread(torch.linalg.svdvals, rows)  # (h, k)
            _, m = margins_from_singular_values(sv, self.rtol * sv[:, 0])
            self.dep_margin[part] = m.cpu().to(torch.float64)
        self.charged[pos] = True


def _resolution(k: int, width: int) -> float:
    """The ratio below which no shifted Cholesky certificate of the Gram route can succeed: its shift
    includes twice the error bound of forming and factoring G (:func:`probes.fast.gram_error`), at least
    16 (k + d) eps lambda_max."""
    return math.sqrt(16 * (k + width) * _F64_EPS)


def _grid_order(multipliers: tuple[float, ...]) -> list[float]:
    """The order in which grid points are decided: on each side of 1 the extreme first (what passes at
    10x, or fails at 0.1x, passes or fails at every point inside), then the points inside by bisection
    (a matrix whose ratio lies inside is decided at about log2 of their number, not at each)."""

    def bisect(points: list[float]) -> list[float]:
        if not points:
            return []
        mid = len(points) // 2
        return [points[mid], *bisect(points[:mid]), *bisect(points[mid + 1 :])]

    below = sorted(m for m in multipliers if m < 1)
    above = sorted(m for m in multipliers if m > 1)
    order = [*below[:1], *above[-1:]]
    return [*order, *bisect(below[1:]), *bisect(above[:-1])]


def _device(src: Matrices) -> torch.device:
    return src.device if src.device is not None else torch.device("cpu")


def analyse(src: Matrices, dec: fast.Decisions, rtol: float, threshold: float, grid: tuple[float, ...] | None,
            *, max_spectra: int | None = None, exact: bool = False) -> tuple[float, Robustness]:
    """The smallest margin and the tolerance fields of a verdict from its decisions ``dec`` on the
    matrices of ``src``; ``exact``: without the work caps (every matrix may get its spectrum)."""
    count = src.count
    if max_spectra is None:
        max_spectra = 2 * count if exact else max(_MIN_SPECTRA, count // _SPECTRA_SHARE)
    ref = _Refiner(src, dec, rtol)
    rtol_grid = ref.grid(grid) if grid is not None else None
    max_factorised = math.inf if exact else max(count // _FACTOR_SHARE, _MIN_FACTOR)
    critical, low, high = ref.critical(threshold, max_spectra, max_factorised)
    min_margin, margin_bound = ref.min_margin(dec, max_spectra, math.inf if exact else count // _FACTOR_SHARE)
    distance = verdict_distance(critical, rtol, low, high)
    return min_margin, Robustness(margin_bound=margin_bound, critical_rtol=critical, critical_rtol_low=low,
                                  critical_rtol_high=high, verdict_margin=distance, rtol_grid=rtol_grid)


def all_dependent_case(rtol: float, ceiling: float, grid: tuple[float, ...] | None,
                       fraction_at: Callable[[float], float], threshold: float,
                       margin_bound: bool) -> Robustness:
    """Every subset is proven dependent at rtol by interlacing: every ratio is at most ``ceiling``
    (< rtol). Grid points above the ceiling are 0; the others come from ``fraction_at(t)``."""
    rtol_grid = None
    low, high = 0.0, ceiling
    if grid is not None:
        shares: dict[float, float] = {}
        share = 1.0
        for m in sorted(grid):  # (the share is non-increasing in t: 0 at one point, 0 at every larger one)
            t = m * rtol
            share = 0.0 if share == 0.0 or t >= ceiling * (1 + _PAD) else fraction_at(t)
            shares[float(m)] = share
            if share >= threshold:
                low = max(low, t)
            else:
                high = min(high, t)
        rtol_grid = {float(m): shares[float(m)] for m in grid}  # (in the caller's order)
    critical = math.sqrt(low * high) if low > 0 and high <= low * (1 + BRACKET_WIDTH) else math.nan
    if high <= ZERO_LEVEL:  # (dependent to within what float64 resolves)
        critical = 0.0
    return Robustness(margin_bound=margin_bound, critical_rtol=critical, critical_rtol_low=low,
                      critical_rtol_high=high, verdict_margin=verdict_distance(critical, rtol, low, high),
                      rtol_grid=rtol_grid)


def pool_matrices(pool: fast.Pool, subsets: torch.Tensor, x64: torch.Tensor, step: int,
                  svd_only: torch.Tensor | None = None) -> Matrices:
    """The k-subsets ``subsets`` (S, k) of a pool (gathered by the fast path's pool, which also gives
    the float32 certificate of stage 0 where it applies); ``svd_only`` (S,) bool: subsets of tiny rows
    (see :class:`Matrices`), or None."""

    def certify32(pos: torch.Tensor, t: float) -> torch.Tensor:  # lambda_min > t^2 lam_hi32, in float32
        return pool.certify32(subsets[pos], math.log10(t / pool.rtol))

    return Matrices(count=int(subsets.shape[0]), k=int(subsets.shape[1]), width=int(x64.shape[1]),
                    gram=lambda pos: pool.gram64(subsets[pos]), rows=pool.rows_of(subsets),
                    lam_cap=pool.lam_cap, step=step, device=x64.device,
                    certify32=certify32 if pool.can32 and pool.rtol > 0 else None, svd_only=svd_only)


def context_matrices(mats: torch.Tensor) -> Matrices:
    """A batch of (k, d) matrices (contexts), k <= d: (B, k, d), any dtype (used in float64)."""
    b, k, d = mats.shape

    def rows(pos: torch.Tensor) -> torch.Tensor:
        return mats[pos].to(torch.float64)  # (c, k, d)

    def gram(pos: torch.Tensor) -> torch.Tensor:
        x = rows(pos)
        return x @ x.transpose(1, 2)  # (c, k, k)

    return Matrices(count=b, k=k, width=d, gram=gram, rows=rows, lam_cap=None,
                    step=max(1, min(1024, fast.chunk_size(k, d))), device=mats.device)


def context_reader(count: int, k: int, d: int, read: Callable[[torch.Tensor], torch.Tensor],
                   device: torch.device | str) -> Matrices:
    """``count`` contexts (k, d), k <= d, read back on demand: ``read(pos)`` gives those at positions ``pos``
    (c, k, d) in any dtype; each is scaled by its own power of two as :func:`probes.assumption2` scales them
    and decided on ``device``. A caller that streamed its contexts to a file passes its reader here."""
    device = torch.device(device)

    def rows(pos: torch.Tensor) -> torch.Tensor:
        x = read(pos.cpu()).to(device)  # (c, k, d)
        scaled, _ = pow2_rescale(x, (1, 2))  # per context, as Assumption 2 scales them
        return scaled.to(torch.float64)

    def gram(pos: torch.Tensor) -> torch.Tensor:
        x = rows(pos)
        return x @ x.transpose(1, 2)  # (c, k, k)

    return Matrices(count=count, k=k, width=d, gram=gram, rows=rows, lam_cap=None,
                    step=max(1, min(1024, fast.chunk_size(k, d))), device=device)
