"""Bits per parameter of the assoc room (``audit bits``): N associations x -> x over N outputs store
log2(N) bits each, so capacity x log2(capacity)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.lab.bits import convergence_flags, unknown_convergence
from auditor.lab.room import BitsReader


def assoc_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit assoc``: N associations x -> x over N outputs store log2(N) bits each."""
    config = frame.apply(lambda r: f"kind={r['kind']}, d={r['d']}, width={r['width']}, seed={r['seed']}",
                         axis=1)
    converged = convergence_flags(frame["converged"]) if "converged" in frame else unknown_convergence(frame)
    return pd.DataFrame(
        {
            "room": "assoc",
            "experiment": "assoc",
            "config": config,
            "stored_bits": frame["capacity"] * np.log2(frame["capacity"].clip(lower=1).astype(float)),
            "parameters": frame["parameters"],
            "formula": "capacity x log2(capacity)",
            "converged": converged,
        }
    )


READER = BitsReader(
    claims=lambda columns: {"capacity", "kind"} <= columns, read=lambda frame, file: assoc_bits(frame)
)
