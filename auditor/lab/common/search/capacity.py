"""Capacity by threshold search, and scaling-law fits with uncertainty.

Capacity of a memory is the largest size N at which it still stores ALL N items (to the 99% accuracy
criterion of paper C). :class:`Bisection` finds that threshold for one memory, assuming success is
monotone in N: it keeps the largest size known to pass (``lo``) and the smallest known to fail
(``hi``), first expanding the bracket when a guess was wrong, then halving it. :func:`search_all` runs
many bisections in lock step so that each round's probes of every search train together as one
batched ensemble.

The fits: :func:`fit_power_law` (least squares on log-log data: exponent and constant with standard
errors and 95% intervals) and :func:`fit_guide_constant` (the constant c of the paper's guide lines
``params = c N ln N`` or ``facts = c params``, with its standard error).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from auditor.core.errors import AuditError

# guide lines of the papers, drawn and fitted against
GUIDE_CONSTANT = {"linear": 1.3, "mlp": 0.35}  # c in d^2 (linear) or m d (MLP) = c N ln N
FACTS_PER_PARAMETER_GUIDE = 0.15  # facts per trainable parameter (factual recall guide line)
LM_BITS_PER_PARAMETER = 2.0  # Allen-Zhu and Li (2024), real language models


class Bisection:
    """Search for the largest passing size in [1, max_size], assuming pass/fail is monotone in size.

    Args:
        guess_lo: first size to try as a lower end (tested; halved while it fails, down to 1).
        guess_hi: first size to try as an upper end (tested; doubled while it passes, up to max_size).
        max_size: never probe beyond this size (a memory passing here has capacity >= max_size).
        rel_tol: stop when ``hi - lo <= max(1, rel_tol * lo)``; 0 finds the exact threshold.
    """

    def __init__(self, guess_lo: int, guess_hi: int, *, max_size: int, rel_tol: float = 0.0) -> None:
        if not 1 <= guess_lo < guess_hi <= max_size:
            raise AuditError(
                f"need 1 <= guess_lo < guess_hi <= max_size, got {guess_lo}, {guess_hi}, {max_size}"
            )
        if not 0 <= rel_tol < 1:
            raise AuditError(f"rel_tol must be in [0, 1), got {rel_tol}")
        self.lo = 0  # largest size known to pass (0: none yet)
        self.hi = max_size + 1  # smallest size known to fail (max_size + 1: none yet)
        self.max_size = max_size
        self.rel_tol = rel_tol
        self._guess_lo, self._guess_hi = guess_lo, guess_hi
        self.history: list[tuple[int, bool]] = []

    @property
    def done(self) -> bool:
        return self.next_probe() is None

    def next_probe(self) -> int | None:
        """The next size to test, or None when the threshold is bracketed to the tolerance."""
        if self.lo == 0 and self.hi > self.max_size:  # nothing tested yet
            return self._guess_lo
        if self.lo == 0:  # only failures so far: shrink towards 1
            return None if self.hi == 1 else max(1, min(self._guess_lo, self.hi // 2))
        if self.hi > self.max_size:  # only passes so far: grow towards max_size
            if self.lo >= self.max_size:
                return None
            return min(self.max_size, max(self._guess_hi, 2 * self.lo))
        if self.hi - self.lo <= max(1, math.floor(self.rel_tol * self.lo)):
            return None
        return (self.lo + self.hi) // 2

    def update(self, size: int, passed: bool) -> None:
        """Record the outcome of testing ``size``."""
        self.history.append((size, bool(passed)))
        if passed:
            self.lo = max(self.lo, size)
        else:
            self.hi = min(self.hi, size)
        if self.lo >= self.hi:
            raise AuditError(
                f"non-monotone outcome: size {self.lo} passed but {self.hi} failed; the capacity "
                "criterion is not monotone at this scale (more steps or seeds may help)"
            )

    @property
    def capacity(self) -> int:
        """The largest size known to pass (0 if even size 1 failed)."""
        return self.lo


def search_all(
    searches: Sequence[Bisection],
    probe: Callable[[list[tuple[int, int]]], Sequence[bool]],
    *,
    max_rounds: int = 64,
) -> int:
    """Run every search to completion, probing all pending sizes of a round in one call.

    Args:
        searches: the bisections (updated in place).
        probe: takes ``[(search index, size), ...]`` and returns pass/fail for each, in order.
        max_rounds: safety cap.

    Returns:
        The number of rounds used.
    """
    for rounds in range(max_rounds):
        pending = [(i, s.next_probe()) for i, s in enumerate(searches)]
        pending = [(i, n) for i, n in pending if n is not None]
        if not pending:
            return rounds
        outcomes = list(probe(pending))
        if len(outcomes) != len(pending):
            raise AuditError(f"probe returned {len(outcomes)} outcomes for {len(pending)} probes")
        for (i, n), ok in zip(pending, outcomes):
            searches[i].update(n, ok)
    raise AuditError(f"threshold search did not finish in {max_rounds} rounds")


@dataclass(frozen=True)
class PowerLawFit:
    """y = constant * x ** exponent, fitted by least squares on (ln x, ln y)."""

    exponent: float
    exponent_se: float
    constant: float
    log_constant_se: float  # standard error of ln(constant)
    r2: float
    n: int

    def ci95(self) -> tuple[float, float]:
        """95% interval of the exponent (Student t with n - 2 degrees of freedom)."""
        t = stats.t.ppf(0.975, self.n - 2) if self.n > 2 else float("inf")
        return self.exponent - t * self.exponent_se, self.exponent + t * self.exponent_se

    def predict(self, x: np.ndarray | float) -> np.ndarray:
        return self.constant * np.asarray(x, dtype=float) ** self.exponent


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> PowerLawFit:
    """Least-squares fit of ln y = ln c + b ln x. Needs at least 3 points with distinct positive x."""
    x_arr, y_arr = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x_arr.shape != y_arr.shape or x_arr.ndim != 1:
        raise AuditError("fit_power_law needs two 1-D sequences of the same length")
    if len(x_arr) < 3 or np.any(x_arr <= 0) or np.any(y_arr <= 0) or len(np.unique(x_arr)) < 2:
        raise AuditError("fit_power_law needs at least 3 positive points with at least 2 distinct x")
    res = stats.linregress(np.log(x_arr), np.log(y_arr))
    return PowerLawFit(
        exponent=float(res.slope),
        exponent_se=float(res.stderr),
        constant=float(math.exp(res.intercept)),
        log_constant_se=float(res.intercept_stderr),
        r2=float(res.rvalue**2),
        n=len(x_arr),
    )


@dataclass(frozen=True)
class ConstantFit:
    """lhs = constant * rhs with the constant fitted as the geometric mean of lhs / rhs."""

    constant: float
    log_se: float  # standard error of ln(constant)
    n: int

    def ci95(self) -> tuple[float, float]:
        t = stats.t.ppf(0.975, self.n - 1) if self.n > 1 else float("inf")
        return self.constant * math.exp(-t * self.log_se), self.constant * math.exp(t * self.log_se)


def fit_guide_constant(lhs: Sequence[float], rhs: Sequence[float]) -> ConstantFit:
    """Fit c in ``lhs = c * rhs`` by least squares on logs (each point weighs the same in ratio).

    For the linear memory lhs = d^2 and rhs = N ln N (the paper's guide is c = 1.3); for the MLP memory
    lhs = m d (guide 0.35); for factual recall lhs = facts and rhs = parameters (guide 0.15).
    """
    lhs_arr, rhs_arr = np.asarray(lhs, dtype=float), np.asarray(rhs, dtype=float)
    if lhs_arr.shape != rhs_arr.shape or len(lhs_arr) < 1 or np.any(lhs_arr <= 0) or np.any(rhs_arr <= 0):
        raise AuditError("fit_guide_constant needs two equally long sequences of positive numbers")
    logs = np.log(lhs_arr / rhs_arr)
    se = float(np.std(logs, ddof=1) / math.sqrt(len(logs))) if len(logs) > 1 else float("inf")
    return ConstantFit(constant=float(math.exp(logs.mean())), log_se=se, n=len(logs))


def n_log_n(n: float | np.ndarray) -> float | np.ndarray:
    """N ln N, the x-axis of the paper's capacity guide lines."""
    n = np.asarray(n, dtype=float)
    return n * np.log(n)


def invert_n_log_n(value: float) -> float:
    """The N with N ln N = value (N >= e^-1); used to turn a guide line into a starting guess."""
    if value <= 0:
        return 1.0
    n = max(value / max(math.log(max(value, 2.0)), 1.0), 1.0)
    for _ in range(50):  # Newton on f(N) = N ln N - value
        n = max(n - (n * math.log(n) - value) / (math.log(n) + 1.0), 1.0)
    return n
