"""The database tensor D and the rank bounds that can be certified without any fitting.

``D in {0,1}^{|K| x |Q| x |V|}`` has ``D[k, q, v] = 1`` iff the triple (k, q, v) is in the database.
Its CP rank (the least number of rank-1 terms a (x) b (x) c summing to D, over the reals) is the size
measure of Paper B. Everything here is exact integer arithmetic, so the bounds are certificates:

* upper bounds, each with an explicit decomposition that reaches it:
  the paper's bound ``min(sum_k |V_k|, sum_q |V_q|)`` (one term per (key, value) pair, or per
  (query, value) pair, see :func:`bound_decomposition`) and the value-slice bound
  ``sum_v rank(D[:, :, v])`` (each value's |K| x |Q| slice split into its matrix rank of terms);
* lower bounds: the rank of each of the three flattenings (a CP decomposition with r terms makes every
  flattening a sum of r rank-1 matrices). For a partial function the value flattening has disjoint
  rows, so its rank is the number of values used. Key and query flattenings are ranked modulo the prime
  2^31 - 1, which can only under-count the rational rank, so the bound stays valid.

:func:`compress` removes zero and repeated slices; it keeps the CP rank (D is the core multiplied along
each mode by a 0/1 matrix of full column rank) and shrinks structured databases a lot.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

import probes
from auditor.lab.facts.database import FactDatabase
from probes.rank import margins_from_singular_values, resolve_rtol

PRIME = 2_147_483_647  # 2^31 - 1: products of two residues fit in int64
_EXACT_RANK_MAX = 400  # Bareiss elimination (exact) up to this many rows and columns after deduplication


def dense_tensor(db: FactDatabase, dtype: Any = np.float64) -> np.ndarray:
    """D as a dense array (|K|, |Q|, |V|) with ones at the triples."""
    out = np.zeros(db.shape, dtype=dtype)
    k, q, v = db.triples.T
    out[k, q, v] = 1
    return out


def values_per_key(db: FactDatabase) -> np.ndarray:
    """(|K|,) |V_k|: distinct values seen with each key."""
    kv = np.unique(db.triples[:, [0, 2]], axis=0)  # (pairs, 2)
    return np.bincount(kv[:, 0], minlength=db.shape[0])


def values_per_query(db: FactDatabase) -> np.ndarray:
    """(|Q|,) |V_q|: distinct values seen with each query."""
    qv = np.unique(db.triples[:, [1, 2]], axis=0)  # (pairs, 2)
    return np.bincount(qv[:, 0], minlength=db.shape[1])


def rank_bound(db: FactDatabase) -> int:
    """Paper B's bound: rank(D) <= min(sum_k |V_k|, sum_q |V_q|)."""
    return int(min(values_per_key(db).sum(), values_per_query(db).sum()))


def bound_decomposition(db: FactDatabase, side: str = "key") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An exact 0/1 CP decomposition of D with sum_k |V_k| (``side="key"``) or sum_q |V_q| terms.

    Side ``key``: one term e_k (x) 1[queries q with v(k, q) = v] (x) e_v per distinct (k, v) pair;
    side ``query`` mirrors it. Returns factors A: (|K|, R), B: (|Q|, R), C: (|V|, R) with
    D = sum_r A[:, r] (x) B[:, r] (x) C[:, r].
    """
    K, Q, V = db.shape
    own, other = (0, 1) if side == "key" else (1, 0)
    pairs, term = np.unique(db.triples[:, [own, 2]], axis=0, return_inverse=True)  # (R, 2), (N,)
    R = len(pairs)
    own_f = np.zeros((db.shape[own], R))
    own_f[pairs[:, 0], np.arange(R)] = 1
    other_f = np.zeros((db.shape[other], R))
    other_f[db.triples[:, other], term.reshape(-1)] = 1
    C = np.zeros((V, R))
    C[pairs[:, 1], np.arange(R)] = 1
    return (own_f, other_f, C) if side == "key" else (other_f, own_f, C)


def rank_mod_p(matrix: np.ndarray) -> int:
    """Rank of an integer matrix modulo 2^31 - 1: a lower bound on its rank over the rationals/reals."""
    a = _dedupe_matrix(np.asarray(matrix))
    if a.size == 0:
        return 0
    if a.shape[1] > a.shape[0]:
        a = a.T
    a = np.mod(a.astype(np.int64), PRIME)  # (m, n), n <= m
    m, n = a.shape
    rank = 0
    for col in range(n):
        nz = np.flatnonzero(a[rank:, col])
        if nz.size == 0:
            continue
        piv = rank + nz[0]
        if piv != rank:
            a[[rank, piv]] = a[[piv, rank]]
        inv = pow(int(a[rank, col]), PRIME - 2, PRIME)
        a[rank, col:] = a[rank, col:] * inv % PRIME
        below = rank + 1 + np.flatnonzero(a[rank + 1 :, col])
        if below.size:
            factor = a[below, col][:, None]  # (b, 1)
            a[below, col:] = (a[below, col:] - factor * a[rank, col:][None, :] % PRIME) % PRIME
        rank += 1
        if rank == m:
            break
    return rank


def exact_matrix_rank(matrix: np.ndarray) -> int:
    """Exact rank over the rationals of an integer matrix (fraction-free Bareiss elimination).

    Falls back to the numerical rank (:func:`probes.numerical_rank`, float64) when the deduplicated matrix
    exceeds 400 x 400 (not certified then).
    """
    a = _dedupe_matrix(np.asarray(matrix))
    if a.size == 0:
        return 0
    if min(a.shape) > _EXACT_RANK_MAX:
        return int(probes.numerical_rank(a.astype(np.float64)).rank)
    if a.shape[1] > a.shape[0]:
        a = a.T
    rows = [[int(x) for x in row] for row in a]
    m, n = len(rows), len(rows[0])
    rank, prev = 0, 1
    for col in range(n):
        piv = next((i for i in range(rank, m) if rows[i][col] != 0), None)
        if piv is None:
            continue
        rows[rank], rows[piv] = rows[piv], rows[rank]
        p = rows[rank][col]
        for i in range(rank + 1, m):
            f = rows[i][col]
            rows[i] = [(p * x - f * y) // prev for x, y in zip(rows[i], rows[rank])]
        prev = p
        rank += 1
        if rank == m:
            break
    return rank


def rank_of_singular_values(s: np.ndarray, rtol: float | None, shape: tuple[int, int]) -> int:
    """probes' rank rule on the descending singular values ``s`` of a float64 matrix of ``shape``: those
    above ``rtol * s[0]`` count (``rtol`` None: probes' default, max(m, n) * eps(float64))."""
    if not s.size:
        return 0
    sv = torch.from_numpy(np.ascontiguousarray(s, dtype=np.float64))
    return int(margins_from_singular_values(sv, sv[0] * resolve_rtol(rtol, *shape, torch.float64))[0])


def _dedupe_matrix(a: np.ndarray) -> np.ndarray:
    """Drop zero and repeated rows and columns (the rank is unchanged)."""
    if a.ndim != 2 or a.size == 0:
        return a.reshape(0, 0)
    a = a[np.any(a != 0, axis=1)]
    a = a[:, np.any(a != 0, axis=0)] if a.size else a.reshape(0, 0)
    if a.size == 0:
        return a.reshape(0, 0)
    a = a[_first_of_unique_rows(a)]
    return a[:, _first_of_unique_rows(a.T)]


def flattening(tensor: np.ndarray, mode: int) -> np.ndarray:
    """Mode-``mode`` flattening (I_mode, product of the other two sizes)."""
    return np.moveaxis(tensor, mode, 0).reshape(tensor.shape[mode], -1)  # (I_mode, rest)


def flattening_ranks(db: FactDatabase, core: np.ndarray | None = None) -> tuple[int, int, int]:
    """Certified lower bounds on rank(D) from the key, query and value flattenings.

    ``core``: the compressed D when the caller has it already (see :func:`compress`).
    """
    core = compress(dense_tensor(db, np.int64)) if core is None else core
    used_values = int(np.unique(db.triples[:, 2]).size)
    return rank_mod_p(flattening(core, 0)), rank_mod_p(flattening(core, 1)), used_values


def value_slice_bound(db: FactDatabase) -> int:
    """sum_v rank(D[:, :, v]): each value's |K| x |Q| slice costs its matrix rank in rank-1 terms."""
    total = 0
    order = np.argsort(db.triples[:, 2], kind="stable")
    t = db.triples[order]
    starts = np.flatnonzero(np.r_[True, t[1:, 2] != t[:-1, 2]])
    for lo, hi in zip(starts, np.r_[starts[1:], len(t)]):
        ks, kinv = np.unique(t[lo:hi, 0], return_inverse=True)
        qs, qinv = np.unique(t[lo:hi, 1], return_inverse=True)
        slice_ = np.zeros((len(ks), len(qs)), dtype=np.int64)
        slice_[kinv.reshape(-1), qinv.reshape(-1)] = 1
        total += exact_matrix_rank(slice_)
    return total


def compress(tensor: np.ndarray) -> np.ndarray:
    """Remove zero and repeated slices along every mode until none is left; the CP rank is unchanged.

    (The tensor is the returned core multiplied along each mode by a 0/1 matrix with one 1 per row and
    full column rank, and the core is a sub-tensor of it, so each rank bounds the other.)
    """
    core = np.asarray(tensor)
    changed = True
    while changed:
        changed = False
        for mode in range(3):
            flat = flattening(core, mode)  # (I_mode, rest)
            nonzero = np.flatnonzero(np.any(flat != 0, axis=1))
            first = _first_of_unique_rows(flat[nonzero])
            if len(first) < core.shape[mode]:
                core = np.take(core, nonzero[first], axis=mode)
                changed = True
    return core


def _first_of_unique_rows(rows: np.ndarray) -> np.ndarray:
    """Sorted indices of the first occurrence of every distinct row of an integer matrix (n, m).

    Rows are grouped by an exact integer hash (wrapping int64 arithmetic), then checked for equality;
    a hash collision (never seen in practice) falls back to numpy's row sort.
    """
    if rows.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    weights = np.random.default_rng(12345).integers(1, 2**62, size=rows.shape[1], dtype=np.int64)
    with np.errstate(over="ignore"):
        key = rows.astype(np.int64) @ weights  # (n,) wraps modulo 2^64
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if not np.array_equal(rows, rows[first[inverse.reshape(-1)]]):
        _, first = np.unique(rows, axis=0, return_index=True)
    return np.sort(first)


@dataclass(frozen=True)
class RankBounds:
    """Certified bounds on rank(D) (exact arithmetic), with the construction or flattening behind each."""

    lower: int
    upper: int
    paper_bound: int  # min(sum_k |V_k|, sum_q |V_q|)
    value_slice_bound: int  # sum_v rank(D[:, :, v])
    flattening: tuple[int, int, int]  # key, query, value flattening ranks (lower bounds)
    core_shape: tuple[int, int, int]  # shape after removing zero and repeated slices

    @property
    def exact(self) -> int | None:
        """The rank when the bounds meet, else None."""
        return self.lower if self.lower == self.upper else None

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["flattening"] = "/".join(str(x) for x in self.flattening)
        row["core_shape"] = "x".join(str(x) for x in self.core_shape)
        row["exact"] = self.exact
        return row


def rank_bounds(db: FactDatabase) -> RankBounds:
    """Certified lower and upper bounds on the CP rank of D."""
    paper = rank_bound(db)
    slices = value_slice_bound(db)
    core = compress(dense_tensor(db, np.int64))
    flat = flattening_ranks(db, core)
    return RankBounds(
        lower=max(flat) if db.num_triples else 0,
        upper=min(paper, slices),
        paper_bound=paper,
        value_slice_bound=slices,
        flattening=flat,
        core_shape=tuple(int(s) for s in core.shape),
    )


def reconstruct(factors: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """sum_r A[:, r] (x) B[:, r] (x) C[:, r] as a dense (I, J, K) array."""
    A, B, C = factors
    return np.einsum("ir,jr,kr->ijk", A, B, C)  # (I, J, K)
