"""Token geometry: how many directions a set of tokens really uses, how much they point one way, and how
close each context is to rank collapse.

Four numbers a reader of a depth profile (one row per layer) expects next to the rank tests:

- ``effective_rank``: exp of the entropy of the normalised singular values (Roy and Vetterli 2007);
- ``stable_rank``: ||X||_F^2 / ||X||_2^2 (Rudelson and Vershynin 2007);
- ``anisotropy``: the mean cosine similarity between distinct tokens (Ethayarajh 2019);
- ``collapse_residual``: per context E, the relative distance ||E - 1 mean(E)||_F / ||E||_F to the
  nearest matrix with identical rows (the residual of Dong, Cordonnier and Loukas 2021, in the
  Frobenius norm).

Raw and centred: a set of tokens that shares one large mean direction (as real language-model tokens
do) has a stable rank near 1 and an anisotropy near 1 whatever the rest looks like. :class:`Geometry`
therefore also gives ``effective_rank_centred``, ``stable_rank_centred`` and ``anisotropy_centred``:
the same measures of the mean-centred tokens ``X - 1 mean(X)``, which show the spread around that
direction. ``collapse_residual`` is centred by construction.

All arithmetic is float64 on the input's device (CPU or CUDA); float64 data whose squares would
underflow or overflow is first rescaled by an exact power of two (every quantity here is
scale-invariant). A matrix or context that is entirely zero gets 0 for every measure (it has rank 0 and
is trivially collapsed); cosines with a zero vector count as 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from probes.rank import Array, as_tensor, check_finite, pow2_rescale

CHUNK_BYTES = 64 * 2**20  # float64 working memory per block of contexts


def _matrices(x: Array, name: str, what: str) -> torch.Tensor:
    """A real, finite, non-empty (..., rows, d) tensor."""
    t = as_tensor(x, name)
    if t.ndim < 2 or t.numel() == 0:
        raise ValueError(f"{name} must be a non-empty {what}; got shape {tuple(t.shape)}")
    check_finite(t, name)
    return t


def _svdvals(x: torch.Tensor) -> torch.Tensor:
    """Singular values (..., min(N, d)), descending, float64, of each rescaled matrix."""
    scaled, _ = pow2_rescale(x, (-2, -1))
    return torch.linalg.svdvals(scaled.to(torch.float64))


def effective_rank(x: Array) -> torch.Tensor:
    """Effective rank of Roy and Vetterli (EUSIPCO 2007): ``exp(-sum_i p_i log p_i)`` with
    ``p_i = sigma_i / sum_j sigma_j`` over the singular values of x.

    It lies in [1, rank(x)]: 1 for a rank-one matrix, r for r equal nonzero singular values (e.g. d for
    the identity of size d); 0 for a zero matrix.

    Args:
        x: (N, d) or a batch (..., N, d), tensor or NumPy array.
    Returns:
        float64 tensor of shape (...) (0-d for one matrix), on the input's device.
    """
    return _effective_rank(_svdvals(_matrices(x, "x", "matrix (N, d) or batch (..., N, d)")))


def _effective_rank(sv: torch.Tensor) -> torch.Tensor:
    """Effective rank from singular values (..., p)."""
    total = sv.sum(-1, keepdim=True)  # (..., 1)
    p = sv / torch.where(total > 0, total, 1.0)  # (..., p)
    entropy = -torch.special.xlogy(p, p).sum(-1)  # (...)
    return torch.where(total[..., 0] > 0, torch.exp(entropy), 0.0)


def stable_rank(x: Array) -> torch.Tensor:
    """Stable rank ``||x||_F^2 / ||x||_2^2 = sum_i sigma_i^2 / sigma_1^2`` (Rudelson and Vershynin,
    J. ACM 2007): in [1, rank(x)], insensitive to tiny singular values; 0 for a zero matrix.

    Args:
        x: (N, d) or a batch (..., N, d), tensor or NumPy array.
    Returns:
        float64 tensor of shape (...) (0-d for one matrix), on the input's device.
    """
    return _stable_rank(_svdvals(_matrices(x, "x", "matrix (N, d) or batch (..., N, d)")))


def _stable_rank(sv: torch.Tensor) -> torch.Tensor:
    """Stable rank from descending singular values (..., p)."""
    top = sv[..., 0]  # (...)
    return torch.where(top > 0, (sv / torch.where(top > 0, top, 1.0)[..., None]).square().sum(-1), 0.0)


def anisotropy(vectors: Array) -> torch.Tensor:
    """Mean cosine similarity over the N (N - 1) ordered pairs of distinct vectors (Ethayarajh,
    EMNLP 2019): 0 for orthogonal (or balanced, symmetric) sets, 1 when all point the same way.

    Computed in O(N d) from the sum of the unit vectors u_i: ``(|sum_i u_i|^2 - sum_i |u_i|^2) /
    (N (N - 1))``, never an N x N matrix.

    Args:
        vectors: (N, d) with N >= 2, or a batch (..., N, d), tensor or NumPy array.
    Returns:
        float64 tensor of shape (...) (0-d for one set), on the input's device.
    """
    x = _matrices(vectors, "vectors", "set of vectors (N, d) or batch (..., N, d)")
    n_vec = x.shape[-2]
    if n_vec < 2:
        raise ValueError(f"anisotropy needs N >= 2 vectors (pairs); got shape {tuple(x.shape)}")
    scaled, _ = pow2_rescale(x, (-1,))  # each row its own power of two: cosines are unchanged
    x64 = scaled.to(torch.float64)
    norms = torch.linalg.vector_norm(x64, dim=-1, keepdim=True)  # (..., N, 1)
    unit = x64 / torch.where(norms > 0, norms, 1.0)  # (..., N, d), zero rows stay zero
    total = unit.sum(-2)  # (..., d)
    self_terms = unit.square().sum((-2, -1))  # (...): number of nonzero rows, up to rounding
    return (total.square().sum(-1) - self_terms) / (n_vec * (n_vec - 1))


def residual_block(n: int, d: int) -> int:
    """How many (n, d) contexts :func:`collapse_residual` takes at once (about ``CHUNK_BYTES`` of float64):
    a caller that streams its contexts feeds it whole blocks of this many."""
    return max(1, CHUNK_BYTES // (8 * n * d))


def collapse_residual(contexts: Array) -> torch.Tensor:
    """Relative distance of each context E (n, d) to the nearest matrix with identical rows:
    ``||E - 1 mean(E)||_F / ||E||_F``, where mean(E) is the mean row (the Frobenius-nearest matrix of
    the form 1 x^T). Dong, Cordonnier and Loukas (ICML 2021) show that pure self-attention drives this
    residual to 0 doubly exponentially with depth (rank collapse); skip connections and MLPs counter it.
    1 when the rows already average to zero; 0 for identical rows or a zero context.

    Works block by block: at most ~64 MiB of float64 at a time, never a float64 copy of all contexts.
    To stream contexts that do not fit in memory, call it per chunk and concatenate (or pass the chunks
    to :func:`token_geometry`).

    Args:
        contexts: (N, n, d), or any batch (..., n, d) (one (n, d) context gives a 0-d result); tensor
            or NumPy array.
    Returns:
        float64 tensor of shape (...), e.g. (N,), on the input's device.
    """
    e = _matrices(contexts, "contexts", "batch of contexts (N, n, d)")
    batch = e.shape[:-2]
    n, d = e.shape[-2:]
    flat = e.reshape(-1, n, d)  # (B, n, d), a view when contiguous
    per_block = residual_block(n, d)
    out = []
    for start in range(0, flat.shape[0], per_block):
        scaled, _ = pow2_rescale(flat[start:start + per_block], (-2, -1))
        block = scaled.to(torch.float64)  # (b, n, d)
        norm = torch.linalg.matrix_norm(block)  # (b,) Frobenius
        resid = torch.linalg.matrix_norm(block - block.mean(-2, keepdim=True))  # (b,)
        out.append(torch.where(norm > 0, resid / torch.where(norm > 0, norm, 1.0), 0.0))
    return torch.cat(out).reshape(batch)  # (...)


@dataclass(frozen=True, repr=False)
class Geometry:
    """Token geometry of a query set (and its contexts).

    Attributes:
        effective_rank: of the (N, d) queries (:func:`effective_rank`).
        stable_rank: of the queries (:func:`stable_rank`).
        anisotropy: mean cosine between distinct queries (:func:`anisotropy`); None for one query (no pair).
        collapse_residual: mean over the contexts of :func:`collapse_residual`; None without contexts.
        effective_rank_centred, stable_rank_centred, anisotropy_centred: the same three measures of the
            mean-centred queries ``X - 1 mean(X)`` (the common mean direction removed); anisotropy_centred
            None for one query.
    """

    effective_rank: float
    stable_rank: float
    anisotropy: float | None
    collapse_residual: float | None
    effective_rank_centred: float
    stable_rank_centred: float
    anisotropy_centred: float | None

    def to_dict(self) -> dict[str, Any]:
        """Flat dict of plain floats (``collapse_residual`` None without contexts)."""
        return asdict(self)

    def __repr__(self) -> str:
        collapse = "None" if self.collapse_residual is None else f"{self.collapse_residual:.4g}"
        return (
            f"Geometry(effective_rank={self.effective_rank:.4g} (centred {self.effective_rank_centred:.4g}), "
            f"stable_rank={self.stable_rank:.4g} (centred {self.stable_rank_centred:.4g}), "
            f"anisotropy={self.anisotropy:.4g} (centred {self.anisotropy_centred:.4g}), "
            f"collapse_residual={collapse})"
        )


def token_geometry(contexts: Array | Iterable[Array] | None, queries: Array) -> Geometry:
    """The geometry measures of one layer's tokens, raw and mean-centred.

    Args:
        contexts: (N, n, d); or an iterable of chunks (b, n, d) (e.g. straight from an extractor,
            so that all contexts are never in memory at once); or None (no ``collapse_residual``).
        queries: (N, d), N >= 1 (one query has no pair: its anisotropies are None).
    Returns:
        :class:`Geometry` with plain floats.
    """
    q = _matrices(queries, "queries", "set of query vectors (N, d)")
    if q.ndim != 2:
        raise ValueError(f"queries must have shape (N, d); got shape {tuple(q.shape)}")
    collapse = None
    if contexts is not None:
        if isinstance(contexts, torch.Tensor | np.ndarray):
            contexts = [contexts]
        total, count = 0.0, 0
        for chunk in contexts:
            c = _matrices(chunk, "contexts", "batch of contexts (N, n, d)")
            if c.ndim != 3:
                raise ValueError(f"contexts must have shape (N, n, d) (or chunks (b, n, d)); got shape "
                                 f"{tuple(c.shape)}")
            if c.shape[-1] != q.shape[1]:
                raise ValueError(f"contexts have width d = {c.shape[-1]} but the queries {tuple(q.shape)} "
                                 f"have d = {q.shape[1]}; valid: contexts (N, n, d) with the queries' N, d")
            res = collapse_residual(c)  # (b,)
            total += float(res.sum())
            count += res.numel()
        if count == 0:
            raise ValueError("contexts held no context; pass (N, n, d) with N >= 1, or None")
        if count != q.shape[0]:
            raise ValueError(f"contexts hold N = {count} examples but the queries {tuple(q.shape)} N = "
                             f"{q.shape[0]}; valid: contexts (N, n, d) with the queries' N and d")
        collapse = total / count
    sv = _svdvals(q)  # (min(N, d),): one SVD for both ranks
    scaled, _ = pow2_rescale(q, (-2, -1))
    q64 = scaled.to(torch.float64)  # (N, d)
    centred = q64 - q64.mean(0, keepdim=True)  # (N, d)
    sv_c = torch.linalg.svdvals(centred)  # (min(N, d),)
    pairs = q.shape[0] >= 2  # anisotropy averages over pairs: undefined for one query
    return Geometry(
        effective_rank=float(_effective_rank(sv)),
        stable_rank=float(_stable_rank(sv)),
        anisotropy=float(anisotropy(q)) if pairs else None,
        collapse_residual=collapse,
        effective_rank_centred=float(_effective_rank(sv_c)),
        stable_rank_centred=float(_stable_rank(sv_c)),
        anisotropy_centred=float(anisotropy(centred)) if pairs else None,
    )
