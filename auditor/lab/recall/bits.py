"""Bits of the recall room (``audit bits``), counted by :mod:`auditor.lab.information`: a table of N = S R
facts, each answer uniform over its relation's D answers, holds N log2 D bits; a model recalling C of them
stores that less the code correcting the other E = N - C (log2(N+1) + log2 C(N, E) + E log2 D), clipped
at 0, so a model at or below chance stores nothing. ``recall scaling`` rows: the largest table stored at
the threshold, C from the passing probe at that size (its fact_recall, else its accuracy), else the fewest
the threshold allows; ``recall tradeoff`` rows: C = fact_recall x facts."""

from __future__ import annotations

import json
import math

import pandas as pd

from auditor.lab.bits import convergence_flags, unknown_convergence
from auditor.lab.information import argmax_stored_bits, uniform_entropy
from auditor.lab.room import BitsReader


def recalled_facts(row: pd.Series) -> int:
    """Facts a ``recall scaling`` row's model recalls at its table size (see the module docstring)."""
    n = int(row["facts"])
    probes = row.get("probes")
    if isinstance(probes, str) and probes.strip().startswith("["):
        passed = [p for p in json.loads(probes) if p.get("facts") == n and p.get("passed")]
        if passed:
            share = passed[-1].get("fact_recall", passed[-1].get("accuracy"))
            return int(round(float(share) * n))
    threshold = float(row["threshold"]) if pd.notna(row.get("threshold")) else 1.0
    return min(n, math.ceil(threshold * n - 1e-9))


def recall_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit recall scaling`` (facts stored) or ``recall tradeoff`` (fact_recall of all facts).

    ``converged``: the CSV's own column where it has one (the threshold was reached or the accuracy
    plateaued); for a trade-off CSV without it, an early stop (steps_trained < the budget ``steps``: every
    fact recalled) or False (it ran its whole budget); empty (unknown) where the CSV records neither."""
    if "answers_per_relation" not in frame:
        raise KeyError("D (answers_per_relation: log2 D bits per fact)")
    tradeoff = "fact_recall" in frame
    n = frame["facts"].astype(float)
    if tradeoff:
        correct = (frame["fact_recall"] * frame["facts"]).round()
    else:
        correct = frame.apply(recalled_facts, axis=1).astype(float) if len(frame) else n
    keys = ("subjects", "relations", "d", "heads", "head_dim", "width", "seed", "budget")
    config = frame.apply(lambda r: ", ".join(f"{k}={r[k]}" for k in keys if k in r), axis=1)
    if "converged" in frame:
        converged = convergence_flags(frame["converged"])
    elif tradeoff and {"steps_trained", "steps"} <= set(frame):  # early stop = every fact recalled
        converged = (frame["steps_trained"] < frame["steps"]).astype(object)
    else:
        converged = unknown_convergence(frame)
    answers = frame["answers_per_relation"].astype(float)
    entropy = uniform_entropy(n, answers)
    stored, residual = argmax_stored_bits(entropy, n, correct, answers)
    recalled = "C = fact_recall x facts" if tradeoff else "C recalled at the largest table stored"
    return pd.DataFrame(
        {
            "room": "recall",
            "experiment": "recall tradeoff" if tradeoff else "recall scaling",
            "config": config,
            "stored_bits": stored,
            "entropy_bits": entropy,
            "residual_bits": residual,
            "parameters": frame["parameters"],
            "formula": f"facts log2(D) - [log2(N+1) + log2 C(N, E) + E log2 D], E = facts - C, {recalled}, "
                       "clipped at 0",
            "converged": converged,
        }
    )


def _claims(columns: set[str]) -> bool:  # D or answers_per_relation: checked on reading
    return "fact_recall" in columns or {"facts", "bits"} <= columns


READER = BitsReader(claims=_claims, read=lambda frame, file: recall_bits(frame))
