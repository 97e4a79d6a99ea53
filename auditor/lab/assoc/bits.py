"""Bits of the assoc room (``audit bits``), counted by :mod:`auditor.lab.information`: a memory of N items
x -> x with independent random input and output embeddings stores a uniformly random pairing of N
inputs with N outputs, log2 N! bits (not N log2 N). Its capacity N is the largest size recalled at the
``threshold`` accuracy, so up to E of the N items may be wrong: the code correcting them,
log2(N+1) + log2 C(N, E) + E log2 N, is subtracted (E from the passing probe's accuracy at N, else the
most the threshold allows), clipped at 0."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from auditor.lab.bits import convergence_flags, unknown_convergence
from auditor.lab.information import argmax_stored_bits, bijection_entropy
from auditor.lab.room import BitsReader


def recalled_at_capacity(row: pd.Series) -> int:
    """Items recalled at the capacity N: the passing probe's accuracy at N where the row records its probes,
    else the fewest the threshold allows (ceil(threshold N))."""
    n = int(row["capacity"])
    probes = row.get("probes")
    if isinstance(probes, str) and probes.strip().startswith("["):
        passed = [p for p in json.loads(probes) if p.get("n_items") == n and p.get("passed")]
        if passed:
            return int(round(float(passed[-1]["accuracy"]) * n))
    threshold = float(row["threshold"]) if pd.notna(row.get("threshold")) else 1.0
    return min(n, math.ceil(threshold * n - 1e-9))


def assoc_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit assoc``: log2 N! of the pairing less the correction of the items not recalled."""
    config = frame.apply(lambda r: f"kind={r['kind']}, d={r['d']}, width={r['width']}, seed={r['seed']}",
                         axis=1)
    converged = convergence_flags(frame["converged"]) if "converged" in frame else unknown_convergence(frame)
    n = frame["capacity"].astype(float)
    correct = frame.apply(recalled_at_capacity, axis=1).astype(float) if len(frame) else n
    entropy = bijection_entropy(n)
    stored, residual = argmax_stored_bits(entropy, n, correct, np.maximum(n, 1.0))
    return pd.DataFrame(
        {
            "room": "assoc",
            "experiment": "assoc",
            "config": config,
            "stored_bits": stored,
            "entropy_bits": entropy,
            "residual_bits": residual,
            "parameters": frame["parameters"],
            "formula": "log2 N! - [log2(N+1) + log2 C(N, E) + E log2 N], N = capacity, clipped at 0",
            "converged": converged,
        }
    )


READER = BitsReader(
    claims=lambda columns: {"capacity", "kind"} <= columns, read=lambda frame, file: assoc_bits(frame)
)
