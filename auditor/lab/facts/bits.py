"""Bits per parameter of the facts room (``audit bits``): facts_stored x log2(values) of every trained
layer. Each facts experiment keeps its own folder (``reports/facts/width``, ...), which names the
experiment of its rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from auditor.lab.room import BitsReader


def facts_bits(frame: pd.DataFrame, experiment: str = "facts") -> pd.DataFrame:
    """Rows of a trained ``audit facts`` experiment (columns facts_stored, values, parameters)."""
    if "tau" in frame:  # one training, one row per softmax threshold: count it once
        frame = frame.drop_duplicates(
            [c for c in ("unit", "db", "d_model", "heads", "d_qk", "d_vo", "seed") if c in frame]
        )
    config = frame.apply(
        lambda r: ", ".join(
            f"{k}={r[k]}" for k in ("db", "d_model", "heads", "d_qk", "d_vo", "seed") if k in r
        ),
        axis=1,
    )
    return pd.DataFrame(
        {
            "room": "facts",
            "experiment": experiment,
            "config": config,
            "stored_bits": frame["facts_stored"] * np.log2(frame["values"].astype(float)),
            "parameters": frame["parameters"],
            "formula": "facts_stored x log2(values)",
            "converged": frame["early_stopped"].astype(bool) if "early_stopped" in frame else None,
        }
    )


def _read(frame: pd.DataFrame, file: Path) -> pd.DataFrame:
    parts = file.parent.parts
    name = " ".join(
        ["facts", *parts[parts.index("facts") + 1 :]] if "facts" in parts else ["facts", file.parent.name]
    )
    return facts_bits(frame, name)


READER = BitsReader(claims=lambda columns: "facts_stored" in columns, read=_read)
