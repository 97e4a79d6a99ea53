"""Bits of the certify room (``audit bits``): a certificate trains nothing, it says that ``guaranteed`` of
the N labels are interpolable (a least-squares readout fits them exactly, whatever they are). Only to
compare it with trained models is that converted to bits, at the label alphabet the rows name
(``classes``): the g interpolable labels are free, the other N - g are sent as they are, so stored =
g log2(classes) of the data's N log2(classes) (:func:`auditor.lab.information.interpolable_stored_bits`),
never more per label than a class carries."""

from __future__ import annotations

import numpy as np
import pandas as pd

from auditor.lab.common.mha.bits import layer_parameters, paper_a_bounds
from auditor.lab.information import interpolable_stored_bits, uniform_entropy
from auditor.lab.room import BitsReader


def certify_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit certify``: ``guaranteed`` labels interpolable, counted at log2(classes) each."""
    parameters = frame.apply(lambda r: layer_parameters(r, d_v=int(r["d_h"])), axis=1)
    config = frame.apply(lambda r: f"weights={r['weights']}, heads={r['heads']}, context={r['context']}, "
                                   f"d_h={r['d_h']}, d={r['d']}, N={r['N']}, seed={r['seed']}", axis=1)
    alphabet = frame["classes"].astype(float)
    stored, residual = interpolable_stored_bits(frame["N"], frame["guaranteed"], alphabet)
    paper_a, dana = paper_a_bounds(frame, pd.Series(np.log2(alphabet), index=frame.index))
    return pd.DataFrame({"room": "memorize", "experiment": "certify", "config": config,
                         "stored_bits": stored, "entropy_bits": uniform_entropy(frame["N"], alphabet),
                         "residual_bits": residual, "parameters": parameters,
                         "formula": "labels interpolable (guaranteed) x log2(classes), compared at the "
                                    "label alphabet",
                         "converged": True, "bound_bits_paper_a": paper_a, "bound_bits_dana": dana})


def _claims(columns: set[str]) -> bool:
    return "guaranteed" in columns and "weights" in columns and "memorized" not in columns


READER = BitsReader(claims=_claims, read=lambda frame, file: certify_bits(frame))
