"""Bits of the rows of paper A's layer (``audit bits``), counted by :mod:`auditor.lab.information`: N
random labels uniform over ``classes`` hold N log2(classes) bits; a run that gets ``memorized`` of them
right by argmax stores that less the code correcting the others, log2(N+1) + log2 C(N, E) + E
log2(classes), clipped at 0 (a model at chance stores nothing). Regression labels uniform in
[0, 1)^outputs, right within +- error_tolerance, are counted as one of (1 / (2 error_tolerance))^outputs
bins. Beside them the paper-A bounds H(n-1)+1 and H d_h + d, in bits of the same labels. The memorize,
certify and capacity rooms' readers count with these helpers."""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.lab.bits import convergence_flags, unknown_convergence
from auditor.lab.information import argmax_stored_bits, uniform_entropy


def layer_parameters(row: pd.Series, d_v: int | None = None, outputs: int | None = None) -> int:
    """Parameters of paper A's layer (spec variant): H(2 d d_h + d d_v) + H d_v d + d d_o."""
    from auditor.lab.common.mha.model import MHAConfig

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
    H d_h + d (Dana et al.) examples, each label counted at ``label_bits`` (log2 of its alphabet)."""
    return ((frame["heads"] * (frame["context"] - 1) + 1) * label_bits,
            (frame["heads"] * frame["d_h"] + frame["d"]) * label_bits)


def label_alphabet(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(alphabet M of one label, regression?) of every row: ``classes``, or (1 / (2 error_tolerance))^outputs
    bins for regression labels."""
    regression = frame["task"].eq("regression") if "task" in frame else pd.Series(False, index=frame.index)
    tolerance = frame["error_tolerance"].astype(float) if "error_tolerance" in frame else pd.Series(
        np.nan, index=frame.index)
    outputs = frame["outputs"].astype(float) if "outputs" in frame else pd.Series(1.0, index=frame.index)
    bins = (1.0 / (2.0 * tolerance.where(regression, 0.25))) ** outputs
    alphabet = pd.Series(np.where(regression, bins, frame["classes"].astype(float)), index=frame.index)
    return alphabet, regression


def memorize_bits(frame: pd.DataFrame, experiment: str = "memorize") -> pd.DataFrame:
    """Rows of ``audit memorize`` (and ``audit capacity``: same columns for what is counted); rows of
    ``audit memorize shared-queries`` (column ``shared_queries``) count under that experiment."""
    if experiment == "memorize" and "shared_queries" in frame:
        experiment = "memorize shared-queries"
    alphabet, regression = label_alphabet(frame)
    entropy = uniform_entropy(frame["N"], alphabet)
    stored, residual = argmax_stored_bits(entropy, frame["N"], frame["memorized"], alphabet)
    parameters = frame["parameters"] if "parameters" in frame else frame.apply(
        lambda r: layer_parameters(r, d_v=int(r["d"]) if "d_v" not in r else None), axis=1)
    labels = np.where(regression, "N x outputs x log2(1 / (2 error_tolerance))", "N log2(classes)")
    formula = pd.Series(labels, index=frame.index) + (
        " - [log2(N+1) + log2 C(N, E) + E log2 M], E = N - memorized, clipped at 0")
    config = frame.apply(
        lambda r: ", ".join(
            f"{k}={r[k]}"
            for k in ("representation", "heads", "context", "d_h", "d", "N", "seed")
            if k in r and pd.notna(r[k])
        ),
        axis=1,
    )
    paper_a, dana = paper_a_bounds(frame, pd.Series(np.log2(alphabet), index=frame.index))
    return pd.DataFrame(
        {
            "room": "memorize",
            "experiment": experiment,
            "config": config,
            "stored_bits": stored,
            "entropy_bits": entropy,
            "residual_bits": residual,
            "parameters": parameters,
            "formula": formula,
            "converged": attention_converged(frame),
            "bound_bits_paper_a": paper_a,
            "bound_bits_dana": dana,
        }
    )
