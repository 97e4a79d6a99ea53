"""Capacity certificates: memorization as linear algebra once the attention is fixed.

For fixed key/query weights, stack per example the per-head convex combinations of its context rows,

    Z in R^{N x H w},   row t = [ E(t)^T s_1(t) ; ... ; E(t)^T s_H(t) ]

Every output is linear in Z, so the layer memorizes any labels on a set of examples whose rows of Z are
linearly independent. The certificate computes Z in float64, its numerical rank r at a stated tolerance
(with the margin in decades, from :func:`probes.numerical_rank`), picks r independent rows by pivoted
QR, solves the minimum-norm least-squares readout on them and *verifies* on all N examples how many
the readout reproduces. Two counts come out, and only the first is a capacity claim:

* ``guaranteed`` = min(rank, N): that many examples have *arbitrary* real labels fitted exactly by a
  linear readout of these attention weights' Z (proven without gradient descent);
* ``readout_hits``: examples the least-squares readout gets right on all N (argmax of the class code,
  or every output within ``error_tolerance``); beyond ``guaranteed`` these are lucky hits, since a class
  needs only the right argmax.

The theory's counts beside them (:func:`lower_bound`, :func:`proposition2_bound`): Theorem 1 of the
memorization paper says SOME key/query weights reach rank(Z) >= H(min(n, d_h) - 1) + 1 when every
context has rank n (so n <= d) and the queries have Kruskal rank >= n: a lower bound on what the best
weights achieve, not a ceiling (random weights may exceed it: softmax is nonlinear, so even d_h = 1
gives rank above 1). With one shared context no weights exceed H(n - 1) + 1 (Proposition 2), a true
ceiling.

Readout targets: regression labels as they are; classes through a 2-d circle code (class c at angle
2 pi c / C, predicted class = the code with the largest inner product), so any number of classes needs
only a rank-2 readout. The readout is realizable by W_V, W_O, W_D when every head's value width
d_v >= the target width (2 for classes, d_o for regression) and the token width w >= it.

Default tolerance: ``max(N, H w) * eps(float32) * sigma_max`` (the layer runs in float32; exact
arithmetic can make softmax features of even tiny d_h look full-rank, so the tolerance is part of
every claim; :func:`tolerance_curve` shows how the rank moves with it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.linalg
import torch

import probes
from auditor.core.errors import AuditError
from auditor.lab.common.mha.data import MemorizeData
from auditor.lab.common.mha.model import MHAEnsemble
from probes.rank import margins_from_singular_values


def proposition2_bound(heads: int, context: int) -> int:
    """H(n-1)+1: the ceiling on rank(Z) for ANY weights when all examples share one context."""
    return heads * (context - 1) + 1


def capacity_bound(heads: int, context: int, d_h: int) -> int:
    """H(min(n, d_h)-1)+1: the rank some key/query weights reach under the theory's assumptions (Theorem 1,
    Proposition 1; the d_h < n case uses key-query products of rank <= d_h). A lower bound, not a ceiling."""
    return heads * (min(context, d_h) - 1) + 1


LOWER_BOUND_NOTE = (
    "n > d: contexts of n rows in width d cannot have rank n (Assumption 2), so the theorem says nothing"
)


def lower_bound(heads: int, context: int, d_h: int, d: int) -> tuple[int | None, str]:
    """(H(min(n, d_h)-1)+1, "") where the theorem applies, else (None, why). It needs rank-n contexts,
    impossible when n > d; the query condition (Kruskal rank >= n) is a property of the data, tested by
    the audit's Assumption 1 (uniform random queries meet it when n <= d)."""
    if context > d:
        return None, LOWER_BOUND_NOTE
    return capacity_bound(heads, context, d_h), ""


@torch.no_grad()
def attention_features(
    model: MHAEnsemble, data: MemorizeData, member: int = 0, chunk: int = 1024
) -> torch.Tensor:
    """Z of member ``member`` on ``data`` in float64: (N, H w), head-major blocks of width w.

    data: contexts (N, n, d) or shared (1, n, d), queries (N, d).
    """
    single = model.member(member).double()
    H, w = single.configs[0].heads, single.configs[0].width
    rows = []
    for start in range(0, data.N, chunk):
        stop = min(start + chunk, data.N)
        q = data.queries[start:stop].double()[None]  # (1, C, d)
        ctx = data.contexts[0].double()[None] if data.shared else data.contexts[start:stop].double()[None]
        _, z = single.features(q, ctx)  # (1, C, H, w)
        rows.append(z[0].reshape(stop - start, H * w))  # (C, H, w) -> (C, H w)
    return torch.cat(rows)


def circle_code(classes: int) -> torch.Tensor:
    """(C, 2) unit vectors at angles 2 pi c / C: a rank-2 code that separates every class."""
    angle = 2 * math.pi * torch.arange(classes, dtype=torch.float64) / classes
    return torch.stack([angle.cos(), angle.sin()], dim=1)


@dataclass(frozen=True)
class Certificate:
    """How many examples a linear readout of Z provably memorizes."""

    N: int  # examples
    features: int  # columns of Z (H w)
    rank: int  # numerical rank of Z at tol
    guaranteed: int  # min(rank, N): examples whose labels are arbitrary yet fitted exactly
    readout_hits: int  # examples the least-squares readout gets right, verified on all N (argmax for classes)
    rtol: float
    tol: float  # absolute threshold sigma_max * rtol
    margin: float  # decades between tol and the nearest deciding singular value
    residual: float  # largest |fit - target| on the selected rows
    readout: str  # "circle-code" | "values"
    target_width: int  # 2 for classes, d_o for regression

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _targets(labels: torch.Tensor, task: str, classes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    if task == "classification":
        code = circle_code(classes)
        return code[labels.long()], code  # (N, 2), (C, 2)
    return labels.double().reshape(labels.shape[0], -1), None  # (N, d_o)


def certify(
    Z: torch.Tensor,
    labels: torch.Tensor,
    *,
    task: str = "classification",
    classes: int = 0,
    error_tolerance: float = 0.05,
    rtol: float | None = None,
    source_dtype: torch.dtype = torch.float32,
) -> Certificate:
    """Certificate for features ``Z`` (N, F) and labels (N,) classes or (N, d_o) values.

    Args:
        task: ``classification`` (needs ``classes``) or ``regression`` (memorized = every output within
            ``error_tolerance``).
        rtol: relative tolerance of the rank; default ``max(N, F) * eps(source_dtype)``.
        source_dtype: the dtype the layer runs in (sets the default tolerance).
    """
    if Z.dim() != 2 or Z.shape[0] != labels.shape[0]:
        raise AuditError(
            f"Z must be (N, F) with one label per row; got Z {tuple(Z.shape)}, labels {tuple(labels.shape)}"
        )
    if task == "classification" and classes < 2:
        raise AuditError("classification certificates need classes >= 2")
    Z = Z.double().cpu()
    N, F = Z.shape
    rank_result = probes.numerical_rank(Z, rtol=rtol, source_dtype=source_dtype)
    r = int(rank_result.rank)
    targets, code = _targets(labels.cpu(), task, classes)
    if r == 0:
        chosen = np.array([], dtype=np.int64)
        W = torch.zeros(F, targets.shape[1], dtype=torch.float64)
    else:
        _, _, pivots = scipy.linalg.qr(
            Z.T.numpy(), mode="economic", pivoting=True
        )  # columns of Z^T = rows of Z
        chosen = np.sort(pivots[:r])
        Zs = Z[torch.from_numpy(chosen)]  # (r, F) independent rows
        W = (
            torch.linalg.pinv(Zs, rtol=1e-13) @ targets[torch.from_numpy(chosen)]
        )  # (F, k) minimum-norm exact fit
    fit = Z @ W  # (N, k)
    residual = (
        float((fit[torch.from_numpy(chosen)] - targets[torch.from_numpy(chosen)]).abs().max()) if r else 0.0
    )
    if code is not None:
        ok = (fit @ code.T).argmax(1) == labels.cpu().long()
    else:
        ok = ((fit - targets).abs() <= error_tolerance).all(1)
    return Certificate(
        N=N, features=F, rank=r, guaranteed=min(r, N), readout_hits=int(ok.sum()), rtol=rank_result.rtol,
        tol=float(rank_result.tol), margin=float(rank_result.margin), residual=residual,
        readout="circle-code" if code is not None else "values", target_width=targets.shape[1],
    )


def readout_realizable(d_v: int, width: int, target_width: int) -> bool:
    """Whether W_V, W_O, W_D can express a readout with ``target_width`` outputs (see module doc)."""
    return d_v >= target_width and width >= target_width


def tolerance_curve(Z: torch.Tensor, rtols: list[float] | None = None) -> pd.DataFrame:
    """Numerical rank of Z against the relative tolerance: columns rtol, rank, tol, margin.

    One SVD serves the whole grid; ranks and margins follow :func:`probes.numerical_rank`'s rule. The
    default grid runs from 1e-15 (about float64 round-off) to 1e-1 in half decades.
    """
    sv = torch.linalg.svdvals(Z.double().cpu())  # (min(N, F),) descending
    grid = rtols if rtols is not None else [10.0 ** (-15 + k / 2) for k in range(29)]
    tol = sv[0] * torch.tensor(grid, dtype=torch.float64)  # (R,)
    rank, margin = margins_from_singular_values(sv.expand(len(grid), -1), tol)  # (R,), (R,)
    return pd.DataFrame({"rtol": grid, "rank": rank.tolist(), "tol": tol.tolist(), "margin": margin.tolist()})
