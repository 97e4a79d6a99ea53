"""The layer tensor L of a fact layer over all prompts, its rank bound, and its thresholded tensors.

For the layer of :mod:`auditor.lab.facts.model`, the logits of the prompt [k, q] are

    L[k, q, :] = x_q W_U + sum_h ( a_h(k, q) KV_h[k] + (1 - a_h(k, q)) QV_h[q] )

with the direct path ``E[q] = x_q W_U`` (|Q| x |V|), the attention patterns ``A_h = a_h`` (|K| x |Q|),
and the value-output paths ``KV_h = X_K W_V^h W_O^h W_U`` (|K| x |V|) and ``QV_h`` (|Q| x |V|), each of
rank <= d_vo. So L = E + sum_h A^h V^h, and L's CP rank is bounded by explicit constructions
(our derivation of Paper B's Proposition 3.5; every number below is a count of rank-1 terms of an
explicit decomposition, which :func:`bound_decomposition` builds and checks):

* key side, the terms carrying x_k: per head, either split KV_h by its SVD into rho_h = rank(KV_h)
  vectors and each diag(g_i) A_h into alpha_h = rank(A_h) terms (rho_h alpha_h terms), or one term per
  key (|K|); or, all heads together, per key k the |Q| x |V| matrix sum_h A_h[k]^T KV_h[k] of rank
  <= min(H, |Q|, |V|);
* query side plus the direct path: rank(E) + per head min(rho'_h beta_h, |Q|) with beta_h = rank(1 - A_h),
  or per query q the |K| x |V| matrix 1 E[q] + sum_h (1 - A_h[:, q]) QV_h[q] of rank <= min(1 + H, |K|, |V|);
* jointly: both value paths of head h leave through the same rows of W_V^h W_O^h W_U (rank
  rho_h <= d_vo), so head h costs sum_i rank(diag(g_i) A_h + (1 - A_h) diag(f_i)) <= d_vo min(|K|, |Q|)
  terms, plus rank(E) <= d_model for the direct path: rank(L) <= d_model + H d_vo min(|K|, |Q|);
* the plain slice bounds of L (e.g. every |Q| x |V| key slice has rank <= d_model).

The widths enter only through rho_h, rho'_h <= d_vo, rank(E) <= d_model and the number of heads;
d_qk shapes A_h (routing) but caps none of these counts, since the sigmoid of a rank-(d_qk + 1) score
matrix is generically of full rank. :func:`architecture_bound` is the worst case over all weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

import probes
from auditor.core.errors import AuditError
from auditor.lab.facts.database import FactDatabase, from_indices
from auditor.lab.facts.model import FactLayer, LayerConfig, numpy_member
from auditor.lab.facts.tensor import flattening, rank_of_singular_values

# Every rank here is probes' rule: a singular value counts above rtol * sigma_max, by default
# rtol = max(m, n) * eps(float64), the round-off of the float64 arithmetic that forms L.


@dataclass(frozen=True, eq=False)
class LayerTensor:
    """The parts of L for one member (float64)."""

    direct: np.ndarray  # E: (Q, V)
    attention: np.ndarray  # A: (H, K, Q), attention of the last position on the key token
    key_values: np.ndarray  # KV: (H, K, V)
    query_values: np.ndarray  # QV: (H, Q, V)
    config: LayerConfig

    @property
    def shape(self) -> tuple[int, int, int]:
        H, K, Q = self.attention.shape
        return K, Q, self.direct.shape[1]

    def full(self) -> np.ndarray:
        """L: (K, Q, V) = E + sum_h A^h KV^h + (1 - A^h) QV^h."""
        A = self.attention
        key_part = np.einsum("hkq,hkv->kqv", A, self.key_values)  # (K, Q, V)
        query_part = np.einsum("hkq,hqv->kqv", 1 - A, self.query_values)  # (K, Q, V)
        return self.direct[None] + key_part + query_part


def layer_tensor(layer: FactLayer, member: int = 0) -> LayerTensor:
    """Decompose one member's logits over all |K| x |Q| prompts into the parts of L."""
    w = numpy_member(layer, member)
    cfg = layer.configs[member]
    K = layer.num_keys
    x_k, x_q = w["embed"][:K], w["embed"][K:]  # (K, d), (Q, d)
    q = np.einsum("qd,hdc->hqc", x_q, w["w_q"])  # (H, Q, dqk)
    key_k = np.einsum("kd,hdc->hkc", x_k, w["w_k"])  # (H, K, dqk)
    key_q = np.einsum("qd,hdc->hqc", x_q, w["w_k"])  # (H, Q, dqk)
    s_k = np.einsum("hqc,hkc->hkq", q, key_k)  # (H, K, Q)
    s_q = np.einsum("hqc,hqc->hq", q, key_q)  # (H, Q)
    A = 1 / (1 + np.exp(-(s_k - s_q[:, None, :]) / np.sqrt(cfg.d_qk)))  # (H, K, Q)
    vo_u = np.einsum("hdc,hce,ev->hdv", w["w_v"], w["w_o"], w["unembed"])  # W_V W_O W_U: (H, d, V)
    return LayerTensor(
        direct=x_q @ w["unembed"],  # (Q, V)
        attention=A,
        key_values=np.einsum("kd,hdv->hkv", x_k, vo_u),  # (H, K, V)
        query_values=np.einsum("qd,hdv->hqv", x_q, vo_u),  # (H, Q, V)
        config=cfg,
    )


def numerical_rank(m: np.ndarray, rtol: float | None = None) -> int:
    """:func:`probes.numerical_rank` of ``m`` (0 for a zero matrix)."""
    return int(probes.numerical_rank(m, rtol=rtol).rank)


def _terms(m: np.ndarray, rtol: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Rank-revealing split m ~= X Y^T with X: (rows, r), Y: (cols, r), r the rank of m by probes' rule."""
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    r = rank_of_singular_values(s, rtol, m.shape)
    return u[:, :r] * s[:r], vt[:r].T


@dataclass(frozen=True)
class LayerBound:
    """The data-dependent bound on rank(L) and the counts behind it."""

    bound: int  # the fewest terms of the three constructions
    joint: int  # direct path + per head sum_i rank(M_i)
    key_side: int  # the two sides built separately
    query_side: int
    slice_bound: int  # min over modes of the sum of slice ranks of L
    construction: str  # "joint", "sides" or "slices": the one that attains the bound
    direct_rank: int
    attention_ranks: tuple[int, ...]  # alpha_h
    value_ranks: tuple[int, ...]  # rho_h (key side)

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        row["attention_ranks"] = "/".join(map(str, self.attention_ranks))
        row["value_ranks"] = "/".join(map(str, self.value_ranks))
        return row


def _key_side(
    lt: LayerTensor, rtol: float | None
) -> tuple[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Fewest key-side terms among the constructions, and those terms as (a, b, c) triples."""
    A, KV = lt.attention, lt.key_values
    K, Q, V = lt.shape
    per_head: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for h in range(A.shape[0]):
        g, p = _terms(KV[h], rtol)  # KV_h = g p^T: (K, rho), (V, rho)
        svd_terms = []
        for i in range(g.shape[1]):
            x, y = _terms(g[:, i, None] * A[h], rtol)  # diag(g_i) A_h = x y^T
            svd_terms += [(x[:, j], y[:, j], p[:, i]) for j in range(x.shape[1])]
        key_terms = [(np.eye(K)[k], A[h, k], KV[h, k]) for k in range(K) if np.any(KV[h, k])]
        per_head += svd_terms if len(svd_terms) <= len(key_terms) else key_terms
    merged = []
    for k in range(K):
        x, y = _terms(np.einsum("hq,hv->qv", A[:, k], KV[:, k]), rtol)  # (Q, V) = x y^T
        merged += [(np.eye(K)[k], x[:, j], y[:, j]) for j in range(x.shape[1])]
    best = per_head if len(per_head) <= len(merged) else merged
    return len(best), best


def _query_side(
    lt: LayerTensor, rtol: float | None
) -> tuple[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Fewest terms for the direct path plus the query-side terms, and the terms."""
    A, QV, E = lt.attention, lt.query_values, lt.direct
    K, Q, V = lt.shape
    x, y = _terms(E, rtol)  # E = x y^T: (Q, r_D), (V, r_D)
    per_head = [(np.ones(K), x[:, j], y[:, j]) for j in range(x.shape[1])]
    for h in range(A.shape[0]):
        g, p = _terms(QV[h], rtol)  # QV_h = g p^T: (Q, rho'), (V, rho')
        svd_terms = []
        for i in range(g.shape[1]):
            u, w = _terms((1 - A[h]) * g[None, :, i], rtol)  # (1 - A_h) diag(g_i) = u w^T
            svd_terms += [(u[:, j], w[:, j], p[:, i]) for j in range(u.shape[1])]
        query_terms = [(1 - A[h, :, q], np.eye(Q)[q], QV[h, q]) for q in range(Q) if np.any(QV[h, q])]
        per_head += svd_terms if len(svd_terms) <= len(query_terms) else query_terms
    merged = []
    for q in range(Q):
        n_q = np.ones((K, 1)) * E[q][None] + np.einsum("hk,hv->kv", 1 - A[:, :, q], QV[:, q])  # (K, V)
        u, w = _terms(n_q, rtol)
        merged += [(u[:, j], np.eye(Q)[q], w[:, j]) for j in range(u.shape[1])]
    best = per_head if len(per_head) <= len(merged) else merged
    return len(best), best


def _joint_terms(lt: LayerTensor, rtol: float | None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Direct path plus, per head, both value paths through the shared rows of W_VO^h W_U.

    KV_h = G P^T and QV_h = F P^T share P (the row space of W_V W_O W_U, rank rho_h <= d_vo), so head h
    adds sum_i M_i (x) p_i with M_i = diag(g_i) A_h + (1 - A_h) diag(f_i):
    sum_i rank(M_i) <= d_vo min(|K|, |Q|).
    """
    A, KV, QV, E = lt.attention, lt.key_values, lt.query_values, lt.direct
    K = lt.shape[0]
    x, y = _terms(E, rtol)
    terms = [(np.ones(K), x[:, j], y[:, j]) for j in range(x.shape[1])]
    for h in range(A.shape[0]):
        _, p = _terms(np.concatenate([KV[h], QV[h]]), rtol)  # common row space: (V, rho)
        g, f = KV[h] @ p, QV[h] @ p  # coordinates (K, rho), (Q, rho); p has orthonormal columns
        for i in range(p.shape[1]):
            m = g[:, i, None] * A[h] + (1 - A[h]) * f[None, :, i]  # (K, Q)
            u, w = _terms(m, rtol)
            terms += [(u[:, j], w[:, j], p[:, i]) for j in range(u.shape[1])]
    return terms


def _slice_terms(L: np.ndarray, rtol: float | None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Terms of the cheapest plain slice decomposition of L (each slice split by its SVD)."""
    best: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
    for mode in range(3):
        terms = []
        for i in range(L.shape[mode]):
            x, y = _terms(np.take(L, i, axis=mode), rtol)
            e = np.eye(L.shape[mode])[i]
            for j in range(x.shape[1]):
                parts = [x[:, j], y[:, j]]
                parts.insert(mode, e)
                terms.append(tuple(parts))
        if best is None or len(terms) < len(best):
            best = terms
    return best or []


def bound_decomposition(
    lt: LayerTensor, rtol: float | None = None
) -> tuple[LayerBound, tuple[np.ndarray, ...]]:
    """The bound and an explicit CP decomposition of L with exactly ``bound`` terms (factors (n, bound))."""
    L = lt.full()
    n_key, key_terms = _key_side(lt, rtol)
    n_query, query_terms = _query_side(lt, rtol)
    joint = _joint_terms(lt, rtol)
    slices = _slice_terms(L, rtol)
    options = {"joint": joint, "sides": key_terms + query_terms, "slices": slices}
    construction = min(options, key=lambda name: len(options[name]))
    terms = options[construction]
    K, Q, V = lt.shape
    factors = tuple(
        np.stack([t[i] for t in terms], axis=1) if terms else np.zeros((n, 0))
        for i, n in enumerate((K, Q, V))
    )
    bound = LayerBound(
        bound=len(terms),
        joint=len(joint),
        key_side=n_key,
        query_side=n_query,
        slice_bound=len(slices),
        construction=construction,
        direct_rank=numerical_rank(lt.direct, rtol),
        attention_ranks=tuple(numerical_rank(a, rtol) for a in lt.attention),
        value_ranks=tuple(numerical_rank(kv, rtol) for kv in lt.key_values),
    )
    return bound, factors


def architecture_bound(config: LayerConfig, shape: tuple[int, int, int]) -> int:
    """Worst case of the bound over all weights, from the widths and the database shape alone."""
    K, Q, V = shape
    d, H, dvo = config.d_model, config.heads, config.d_vo
    alpha = min(K, Q)
    rho_k, rho_q, r_direct = min(dvo, d, K, V), min(dvo, d, Q, V), min(d, Q, V)
    key = min(H * min(rho_k * alpha, K), K * min(H, Q, V))
    query = min(r_direct + H * min(rho_q * alpha, Q), Q * min(1 + H, K, V))
    joint = r_direct + H * min(dvo, d, V) * alpha
    slices = min(K * min(Q, V, d), Q * min(K, V, d), V * min(K, Q))
    return int(min(joint, key + query, slices))


def flattening_lower_bound(L: np.ndarray, rtol: float | None = None) -> int:
    """max of the numerical flattening ranks of L: no decomposition with fewer terms reproduces L."""
    return max(numerical_rank(flattening(L, m), rtol) for m in range(3))


def threshold_database(L: np.ndarray, tau: float, *, name: str = "softmax>=tau") -> FactDatabase:
    """softmax>=tau(L) as a database: (k, q, v) present iff softmax(L[k, q])_v >= tau (needs tau > 0.5
    for a partial function; at tau = 0.5 two values of exactly 0.5 would clash and raise)."""
    if not 0.5 <= tau < 1:
        raise AuditError(f"tau must be in [0.5, 1) for softmax>=tau to be a partial function, got {tau}")
    z = L - L.max(-1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(-1, keepdims=True)  # (K, Q, V)
    triples = np.argwhere(prob >= tau)  # (N, 3)
    return from_indices(triples, L.shape, name=name)
