"""Bits of the lm room (``audit bits``): the dataset's entropy n S log2 V less the model's log-loss in bits,
clipped at 0 (:func:`auditor.lab.information.logloss_stored_bits`), per trainable parameter."""

from __future__ import annotations

import pandas as pd

from auditor.lab.bits import convergence_flags
from auditor.lab.information import logloss_stored_bits, uniform_entropy
from auditor.lab.lm.experiment import settled
from auditor.lab.room import BitsReader


def lm_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit lm``: the entropy recomputed from the row's own sizes, its log-loss as the residual."""
    entropy = uniform_entropy(frame["tokens"], frame["vocab"].astype(float))
    flags = convergence_flags(frame["converged"])
    flags[flags.eq(True) & ~settled(frame)] = False  # a model still at chance has not begun: no plateau
    stored, residual = logloss_stored_bits(entropy, frame["logloss_bits"])
    config = frame.apply(lambda r: f"model={r['model']}, sequences={r['sequences']}, seed={r['seed']}, "
                                   f"dtype={r['dtype']}", axis=1)
    return pd.DataFrame({
        "room": "lm",
        "experiment": "lm " + frame["dtype"].astype(str),
        "config": config,
        "stored_bits": stored,
        "entropy_bits": entropy,
        "residual_bits": residual,
        "parameters": frame["parameters"],
        "formula": "tokens log2(vocab) - log-loss (bits), clipped at 0",
        "converged": flags,
    })


READER = BitsReader(claims=lambda columns: {"logloss_bits", "memorized_bits"} <= columns,
                    read=lambda frame, file: lm_bits(frame))
