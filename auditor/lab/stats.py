"""Statistics the lab's rooms share: intervals over seeds, their text in reports, and the ``converged``
cells of result CSVs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.stats


def mean_ci(values: np.ndarray | pd.Series, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided Student-t interval of the mean (scipy.stats.t); NaN bounds with fewer
    than two finite values, the mean itself when they all agree."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(v.mean())
    if v.size < 2:
        return mean, float("nan"), float("nan")
    sem = float(scipy.stats.sem(v))
    if sem == 0:
        return mean, mean, mean
    low, high = scipy.stats.t.interval(confidence, v.size - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def interval_text(mean: float, low: float, high: float) -> str:
    """``mean [low, high]`` at one decimal: "-" without a mean, the mean alone without an interval."""
    if pd.isna(mean):
        return "-"
    return f"{mean:.1f}" if pd.isna(low) else f"{mean:.1f} [{low:.1f}, {high:.1f}]"


def intervals(frame: pd.DataFrame, mean: str, low: str, high: str) -> list[str]:
    """:func:`interval_text` of every row of ``frame``, from its columns ``mean``, ``low`` and ``high``."""
    return [interval_text(*v) for v in frame[[mean, low, high]].itertuples(index=False)]


def is_true(value: object) -> bool:
    """A flag cell as written to a CSV (bool, 'True', 1, ...) as a bool; empty or NaN is False."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return str(value).strip().lower() in ("true", "1", "1.0")
