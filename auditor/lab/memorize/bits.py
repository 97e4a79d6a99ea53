"""Bits per parameter of the memorize room (``audit bits``): memorized x log2(classes) for classification,
memorized x outputs x log2(1 / (2 error_tolerance)) for regression (a label known to +- error_tolerance in
[0, 1) is one of that many bins); beside them the paper-A bounds H(n-1)+1 and H d_h + d in the same unit.
The certify and capacity rooms count their layer with the same helpers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.lab.bits import convergence_flags, unknown_convergence
from auditor.lab.room import BitsReader


def layer_parameters(row: pd.Series, d_v: int | None = None, outputs: int | None = None) -> int:
    """Parameters of paper A's layer (spec variant): H(2 d d_h + d d_v) + H d_v d + d d_o."""
    from auditor.lab.memorize.model import MHAConfig

    return MHAConfig(heads=int(row["heads"]), d=int(row["d"]), d_h=int(row["d_h"]),
                     d_v=int(d_v if d_v is not None else row.get("d_v", row["d_h"])),
                     outputs=int(outputs if outputs is not None else row["classes"])).num_parameters


def attention_converged(frame: pd.DataFrame) -> pd.Series:
    """The ``converged`` column, or for older CSVs: all memorized or stopped early (steps_trained < steps)."""
    if "converged" in frame:
        return convergence_flags(frame["converged"])
    if {"steps_trained", "steps"} <= set(frame):
        return (frame["memorized"] >= frame["N"]) | (frame["steps_trained"] < frame["steps"])
    return unknown_convergence(frame)


def paper_a_bounds(frame: pd.DataFrame, label_bits: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Bits of H(n-1)+1 (Proposition 2's ceiling; Theorem 1 at d_h >= n) and of
    H d_h + d (Dana et al.) examples."""
    return ((frame["heads"] * (frame["context"] - 1) + 1) * label_bits,
            (frame["heads"] * frame["d_h"] + frame["d"]) * label_bits)


def memorize_bits(frame: pd.DataFrame, experiment: str = "memorize") -> pd.DataFrame:
    """Rows of ``audit memorize`` (and ``audit capacity``: same columns for what is counted); rows of
    ``audit memorize shared-queries`` (column ``shared_queries``) count under that experiment."""
    if experiment == "memorize" and "shared_queries" in frame:
        experiment = "memorize shared-queries"
    regression = frame["task"].eq("regression") if "task" in frame else pd.Series(False, index=frame.index)
    tolerance = (
        frame["error_tolerance"].astype(float)
        if "error_tolerance" in frame
        else pd.Series(np.nan, index=frame.index)
    )
    outputs = frame["outputs"] if "outputs" in frame else pd.Series(1, index=frame.index)
    label_bits = np.where(regression, outputs * np.log2(1.0 / (2.0 * tolerance.where(regression, 0.25))),
                          np.log2(frame["classes"].astype(float)))
    label_bits = pd.Series(label_bits, index=frame.index)
    parameters = frame["parameters"] if "parameters" in frame else frame.apply(
        lambda r: layer_parameters(r, d_v=int(r["d"]) if "d_v" not in r else None), axis=1)
    formula = np.where(
        regression, "memorized x outputs x log2(1 / (2 error_tolerance))", "memorized x log2(classes)"
    )
    config = frame.apply(
        lambda r: ", ".join(
            f"{k}={r[k]}"
            for k in ("representation", "heads", "context", "d_h", "d", "N", "seed")
            if k in r and pd.notna(r[k])
        ),
        axis=1,
    )
    paper_a, dana = paper_a_bounds(frame, label_bits)
    return pd.DataFrame(
        {
            "room": "memorize",
            "experiment": experiment,
            "config": config,
            "stored_bits": frame["memorized"] * label_bits,
            "parameters": parameters,
            "formula": formula,
            "converged": attention_converged(frame),
            "bound_bits_paper_a": paper_a,
            "bound_bits_dana": dana,
        }
    )


def _claims(columns: set[str]) -> bool:
    return "memorized" in columns and "representation" not in columns


READER = BitsReader(claims=_claims, read=lambda frame, file: memorize_bits(frame))
