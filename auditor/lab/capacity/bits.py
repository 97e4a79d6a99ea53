"""Bits of the capacity room (``audit bits``): random labels over ``classes`` on reduced real tokens, counted
like the memorize room's layer (d_h = d_v = d): N log2(classes) less the code that corrects the labels the
layer gets wrong, clipped at 0 (:mod:`auditor.lab.information`)."""

from __future__ import annotations

import pandas as pd

from auditor.lab.common.mha.bits import layer_parameters, memorize_bits
from auditor.lab.room import BitsReader


def capacity_bits(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``audit capacity`` (a layer with d_h = d_v = d on reduced real tokens)."""
    if "parameters" not in frame:
        frame = frame.assign(parameters=frame.apply(lambda r: layer_parameters(r, d_v=int(r["d"])), axis=1))
    return memorize_bits(frame.assign(task="classification"), "capacity")


READER = BitsReader(claims=lambda columns: {"memorized", "representation"} <= columns,
                    read=lambda frame, file: capacity_bits(frame))
