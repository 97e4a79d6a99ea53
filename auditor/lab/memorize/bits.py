"""Bits of the memorize room (``audit bits``), counted by :mod:`auditor.lab.information`: N random labels
uniform over ``classes`` hold N log2(classes) bits; a run that gets ``memorized`` of them right by argmax
stores that less the code correcting the others, log2(N+1) + log2 C(N, E) + E log2(classes), clipped at
0 (a model at chance stores nothing). Regression labels uniform in [0, 1)^outputs, right within
+- error_tolerance, are counted as one of (1 / (2 error_tolerance))^outputs bins. Beside them the paper-A
bounds H(n-1)+1 and H d_h + d, in bits of the same labels. The helpers live in the lab's shared layer
(:mod:`auditor.lab.common.mha.bits`), where the certify and capacity rooms count their layer too."""

from __future__ import annotations

from auditor.lab.common.mha.bits import memorize_bits
from auditor.lab.room import BitsReader


def _claims(columns: set[str]) -> bool:
    return "memorized" in columns and "representation" not in columns


READER = BitsReader(claims=_claims, read=lambda frame, file: memorize_bits(frame))
