"""Exact CP rank of small integer tensors, where it can be certified.

Real tensor rank is NP-hard in general, so this module only answers when a certificate exists, and
otherwise returns the certified interval. After removing zero and repeated slices
(:func:`~auditor.lab.facts.tensor.compress`, rank-preserving) it uses, in exact rational arithmetic:

* lower bounds: the ranks of the three flattenings;
* upper bounds: for each mode, the sum of the matrix ranks of its slices (for a database these are
  sum_k |V_k|, sum_q |V_q| and sum_v rank(D[:, :, v]));
* a mode of size 2 whose two n x n slices span a regular pencil (some combination P is invertible):
  Ja'Ja''s theorem, in its real form (Sumi, Miyazaki and Sakata 2009), gives the rank exactly as
  n + delta(F), F = P^{-1} Q, where delta counts the invariant polynomials of F that do not split into
  distinct real linear factors. This settles the classic cases that flattenings cannot, such as the W
  tensor (rank 3, every flattening rank 2) and the 90-degree rotation pencil (rank 3 over the reals).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from auditor.core.errors import AuditError
from auditor.lab.facts.database import FactDatabase
from auditor.lab.facts.tensor import compress, dense_tensor, exact_matrix_rank, flattening

MAX_PENCIL = 16  # largest n of an n x n x 2 pencil handled symbolically


@dataclass(frozen=True)
class ExactRank:
    """An exact rank (``rank``) when certified, always with the certified interval."""

    rank: int | None
    lower: int
    upper: int
    method: str  # "bounds meet" | "pencil" | "open"
    core_shape: tuple[int, int, int]

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["core_shape"] = "x".join(str(s) for s in self.core_shape)
        return {f"exact_{k}" if k != "rank" else "exact_rank": v for k, v in row.items()}


def exact_rank(tensor: np.ndarray | FactDatabase) -> ExactRank:
    """Certified rank of an integer 3-way tensor (or a database's D), or the certified interval."""
    dense = dense_tensor(tensor, np.int64) if isinstance(tensor, FactDatabase) else np.asarray(tensor)
    if dense.ndim != 3:
        raise AuditError(f"exact rank needs a 3-way tensor, got shape {dense.shape}")
    if dense.size and not np.all(np.equal(np.mod(dense, 1), 0)):
        raise AuditError("exact rank needs an integer tensor (a database or a 0/1 / integer array)")
    core = compress(dense.astype(np.int64))
    shape = tuple(int(s) for s in core.shape)
    if core.size == 0:
        return ExactRank(0, 0, 0, "bounds meet", shape)
    lower = max(exact_matrix_rank(flattening(core, m)) for m in range(3))
    upper = min(
        sum(exact_matrix_rank(np.take(core, i, axis=m)) for i in range(core.shape[m])) for m in range(3)
    )
    if lower == upper:
        return ExactRank(lower, lower, upper, "bounds meet", shape)
    for mode in range(3):
        if shape[mode] == 2:
            r = pencil_rank(np.take(core, 0, axis=mode), np.take(core, 1, axis=mode))
            if r is not None:
                return ExactRank(r, r, r, "pencil", shape)
    return ExactRank(None, lower, upper, "open", shape)


def pencil_rank(a: np.ndarray, b: np.ndarray) -> int | None:
    """Real rank of the n x n x 2 tensor with slices ``a`` and ``b`` when the pencil is regular.

    Returns None for a non-square or singular pencil (Kronecker singular blocks, not handled) or
    n > MAX_PENCIL.
    """
    import sympy as sp
    from sympy.matrices.normalforms import invariant_factors

    if a.shape != b.shape or a.shape[0] != a.shape[1] or a.shape[0] > MAX_PENCIL:
        return None
    n = a.shape[0]
    A = sp.Matrix(a.astype(object).tolist())
    B = sp.Matrix(b.astype(object).tolist())
    # an invertible member of the pencil: det(A + cB) is a polynomial of degree <= n in c
    choice = next(((A + c * B, B) for c in range(n + 1) if (A + c * B).det() != 0), None)
    if choice is None:
        if B.det() == 0:
            return None  # singular pencil: det(sA + tB) vanishes identically
        choice = (B, A)
    P, Q = choice
    F = P.inv() * Q
    s = sp.Symbol("s")
    factors = invariant_factors(s * sp.eye(n) - F, domain=sp.QQ[s])
    delta = 0
    for f in factors:
        poly = sp.Poly(sp.sympify(f.as_expr() if hasattr(f, "as_expr") else f), s)
        if poly.degree() < 1:
            continue
        squarefree = sp.gcd(poly, poly.diff(s)).degree() == 0
        if not (squarefree and poly.count_roots() == poly.degree()):
            delta += 1
    return n + delta
