"""Bits per parameter of the certify room (``audit bits``): guaranteed x REAL_BITS, ``guaranteed`` arbitrary
real labels fitted exactly, counted at float32 precision (24 significant bits, the layer's dtype)."""

from __future__ import annotations

import pandas as pd

from auditor.lab.memorize.bits import layer_parameters, paper_a_bounds
from auditor.lab.room import BitsReader

REAL_BITS = 24  # significand bits of float32: the precision a certified real label is counted at


def certify_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit certify``: guaranteed exact reals at float32 precision (one label per example)."""
    parameters = frame.apply(lambda r: layer_parameters(r, d_v=int(r["d_h"])), axis=1)
    config = frame.apply(lambda r: f"weights={r['weights']}, heads={r['heads']}, context={r['context']}, "
                                   f"d_h={r['d_h']}, d={r['d']}, N={r['N']}, seed={r['seed']}", axis=1)
    paper_a, dana = paper_a_bounds(frame, pd.Series(float(REAL_BITS), index=frame.index))
    return pd.DataFrame({"room": "memorize", "experiment": "certify", "config": config,
                         "stored_bits": frame["guaranteed"] * REAL_BITS, "parameters": parameters,
                         "formula": f"guaranteed x {REAL_BITS} (exact reals at float32 precision)",
                         "converged": True, "bound_bits_paper_a": paper_a, "bound_bits_dana": dana})


def _claims(columns: set[str]) -> bool:
    return "guaranteed" in columns and "weights" in columns and "memorized" not in columns


READER = BitsReader(claims=_claims, read=lambda frame, file: certify_bits(frame))
