"""The plateau rule shared by the associative-memory room's sweeps: when a run that ended below its
accuracy threshold counts as converged (it had stopped improving) rather than step-limited."""

from __future__ import annotations

import pandas as pd

from auditor.core.errors import AuditError

# A run that ends below the threshold counts as converged when its accuracy rose by less than
# PLATEAU_GAIN over the last PLATEAU_WINDOW of its budget (it had stopped improving); otherwise its
# failure is the budget's, and the row that depends on it is flagged ``converged`` = False.
PLATEAU_GAIN = 0.01
PLATEAU_WINDOW = 0.25


def accuracy_at(history: pd.DataFrame, budget: int) -> float:
    """Accuracy of one member's run after ``budget`` steps: its last evaluation at or before ``budget``
    (a member frozen earlier keeps the accuracy it froze at). ``history``: that member's rows
    (``step``, ``accuracy``) of :attr:`~auditor.lab.engine.TrainResult.history`."""
    seen = history[history["step"] <= budget]
    if seen.empty:
        raise AuditError(f"no evaluation at or before step {budget}")
    return float(seen["accuracy"].iloc[-1])


def plateau_gain(history: pd.DataFrame, budget: int) -> float:
    """How much one member's accuracy rose over the last ``PLATEAU_WINDOW`` of a ``budget``-step run
    (its evaluations at or before ``budget`` and ``budget (1 - PLATEAU_WINDOW)``). ``history``: that
    member's rows (``step``, ``accuracy``) of :attr:`~auditor.lab.engine.TrainResult.history`."""
    return accuracy_at(history, budget) - accuracy_at(history, int(budget * (1 - PLATEAU_WINDOW)))
