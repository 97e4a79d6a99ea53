"""Bits per parameter of the recall room (``audit bits``): facts x log2(D) (``recall scaling``), fact_recall x
facts x log2(D) (``recall tradeoff``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.lab.bits import convergence_flags, unknown_convergence
from auditor.lab.room import BitsReader


def recall_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit recall scaling`` (facts stored) or ``recall tradeoff`` (fact_recall of all facts).

    ``converged``: the CSV's own column where it has one (the threshold was reached or the accuracy
    plateaued); for a trade-off CSV without it, an early stop (steps_trained < the budget ``steps``: every
    fact recalled) or False (it ran its whole budget); empty (unknown) where the CSV records neither."""
    if "answers_per_relation" not in frame:
        raise KeyError("D (answers_per_relation: log2 D bits per fact)")
    tradeoff = "fact_recall" in frame
    facts = (frame["fact_recall"] * frame["facts"]).round() if tradeoff else frame["facts"]
    keys = ("subjects", "relations", "d", "heads", "head_dim", "width", "seed", "budget")
    config = frame.apply(lambda r: ", ".join(f"{k}={r[k]}" for k in keys if k in r), axis=1)
    if "converged" in frame:
        converged = convergence_flags(frame["converged"])
    elif tradeoff and {"steps_trained", "steps"} <= set(frame):  # early stop = every fact recalled
        converged = (frame["steps_trained"] < frame["steps"]).astype(object)
    else:
        converged = unknown_convergence(frame)
    return pd.DataFrame(
        {
            "room": "recall",
            "experiment": "recall tradeoff" if tradeoff else "recall scaling",
            "config": config,
            "stored_bits": facts * np.log2(frame["answers_per_relation"].astype(float)),
            "parameters": frame["parameters"],
            "formula": "fact_recall x facts x log2(D)" if tradeoff else "facts x log2(D)",
            "converged": converged,
        }
    )


def _claims(columns: set[str]) -> bool:  # D or answers_per_relation: checked on reading
    return "fact_recall" in columns or {"facts", "bits"} <= columns


READER = BitsReader(claims=_claims, read=lambda frame, file: recall_bits(frame))
