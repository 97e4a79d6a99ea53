"""Automatic detection of the learning stages of factual recall (paper C, Figure 5).

Trained from a tiny initialisation, the linear-attention model passes three stages: a plateau at the
loss of the uniform prediction, ln(R D); a plateau at ln D, the *hallucination* stage, where the model
knows the relation (its relation-only loss is about 0) but not the subject, so it spreads its guess
over the D answers of that relation; and convergence to zero loss. The authors shaded these stages by
hand; :func:`detect_stages` finds them in the loss curves and reports the boundaries as step numbers.

A plateau at level L is the longest run of consecutive evaluations whose (median-smoothed) loss lies
within ``band`` (a fraction of L) of L. Convergence is the first step after which the smoothed loss
stays below ``converged_below`` to the end. The hallucination plateau is *confirmed* when the
relation-only loss in its middle is below ``relation_below``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.ndimage import median_filter

from auditor.core.errors import AuditError


@dataclass(frozen=True)
class Plateau:
    """Evaluations from ``start`` to ``end`` (step numbers, inclusive) stay near ``level``."""

    level: float
    start: int
    end: int
    mean: float  # mean smoothed loss over the plateau

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Stages:
    """The detected stages. Missing stages are None."""

    uniform: Plateau | None  # loss near ln(R D)
    hallucination: Plateau | None  # loss near ln D
    converged_at: int | None  # first step after which the loss stays below the threshold
    hallucination_confirmed: bool  # relation-only loss ~0 during the hallucination plateau
    relation_loss_mid: float | None  # relation-only loss in the middle of that plateau

    def boundaries(self) -> dict[str, int | None]:
        """The stage boundaries as step numbers (None when a stage was not found)."""
        return {
            "uniform_end": self.uniform.end if self.uniform else None,
            "hallucination_start": self.hallucination.start if self.hallucination else None,
            "hallucination_end": self.hallucination.end if self.hallucination else None,
            "converged_at": self.converged_at,
        }

    def to_dict(self) -> dict:
        return {**asdict(self), **self.boundaries()}


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    return median_filter(values, size=window, mode="nearest") if window > 1 else values


def find_plateau(steps: Sequence[int], loss: Sequence[float], level: float, *, band: float = 0.1,
                 window: int = 5, min_points: int = 3) -> Plateau | None:
    """The longest run of evaluations whose smoothed loss is within ``band * level`` of ``level``.

    Args:
        steps: (P,) increasing step numbers of the evaluations.
        loss: (P,) loss at those steps.
        level: the plateau height (e.g. ln 32).
        band: half-width of the acceptance band, as a fraction of ``level``.
        window: median-filter width (in evaluations) applied first, against noise.
        min_points: shorter runs are not plateaus.
    """
    steps_arr, loss_arr = _check(steps, loss)
    near = np.abs(_smooth(loss_arr, window) - level) <= band * level
    best: tuple[int, int] | None = None
    i = 0
    while i < len(near):
        if not near[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(near) and near[j + 1]:
            j += 1
        if j - i + 1 >= min_points and (best is None or j - i > best[1] - best[0]):
            best = (i, j)
        i = j + 1
    if best is None:
        return None
    i, j = best
    return Plateau(level=level, start=int(steps_arr[i]), end=int(steps_arr[j]),
                   mean=float(_smooth(loss_arr, window)[i : j + 1].mean()))


def convergence_step(
    steps: Sequence[int], loss: Sequence[float], *, below: float, window: int = 5
) -> int | None:
    """First step after which the smoothed loss stays below ``below`` until the end (None if never)."""
    steps_arr, loss_arr = _check(steps, loss)
    ok = _smooth(loss_arr, window) < below
    if not ok[-1]:
        return None
    bad = np.flatnonzero(~ok)
    first = 0 if len(bad) == 0 else int(bad[-1]) + 1
    return int(steps_arr[first])


def detect_stages(
    steps: Sequence[int],
    total_loss: Sequence[float],
    *,
    num_answers: int,
    answers_per_relation: int,
    relation_loss: Sequence[float] | None = None,
    band: float = 0.1,
    window: int = 5,
    min_points: int = 3,
    converged_below: float = 0.1,
    relation_below: float = 0.1,
) -> Stages:
    """Find the uniform plateau (ln num_answers), the hallucination plateau (ln D) and convergence.

    Args:
        steps, total_loss: (P,) evaluations of the total loss.
        num_answers: R D, the size of the output vocabulary.
        answers_per_relation: D.
        relation_loss: (P,) relation-only loss at the same steps (confirms the hallucination stage).
        band, window, min_points: see :func:`find_plateau`.
        converged_below: loss (nats) under which the model counts as converged.
        relation_below: relation-only loss (nats) under which the relation counts as known.
    """
    if num_answers <= answers_per_relation or answers_per_relation < 2:
        raise AuditError(
            f"need R D > D >= 2 to tell the stages apart, got R D={num_answers}, D={answers_per_relation}"
        )
    uniform_level, halluc_level = math.log(num_answers), math.log(answers_per_relation)
    if (1 + band) * halluc_level >= (1 - band) * uniform_level:
        raise AuditError(
            f"band={band} makes the plateau levels ln {num_answers} and ln {answers_per_relation} overlap"
        )
    uniform = find_plateau(steps, total_loss, uniform_level, band=band, window=window, min_points=min_points)
    halluc = find_plateau(steps, total_loss, halluc_level, band=band, window=window, min_points=min_points)
    if (
        uniform and halluc and halluc.start <= uniform.end
    ):  # a hallucination plateau must come after the uniform one
        halluc = None
    converged = convergence_step(steps, total_loss, below=converged_below, window=window)
    confirmed, rel_mid = False, None
    if halluc is not None and relation_loss is not None:
        steps_arr, rel_arr = _check(steps, relation_loss)
        mid = (halluc.start + halluc.end) / 2
        rel_mid = float(_smooth(rel_arr, window)[int(np.argmin(np.abs(steps_arr - mid)))])
        confirmed = rel_mid < relation_below
    return Stages(uniform=uniform, hallucination=halluc, converged_at=converged,
                  hallucination_confirmed=confirmed, relation_loss_mid=rel_mid)


def _check(steps: Sequence[int], values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    steps_arr, values_arr = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if steps_arr.ndim != 1 or steps_arr.shape != values_arr.shape or len(steps_arr) == 0:
        raise AuditError("steps and loss must be non-empty 1-D sequences of the same length")
    if np.any(np.diff(steps_arr) <= 0):
        raise AuditError("steps must be strictly increasing")
    if not np.all(np.isfinite(values_arr)):
        raise AuditError("the loss curve contains NaN or infinite values")
    return steps_arr, values_arr
