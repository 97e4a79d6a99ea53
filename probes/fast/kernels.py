"""The linear algebra of the proofs: shifted Cholesky factorisations, the vector a failed
factorisation exposes, Rayleigh bounds and proven ceilings on sigma_k / sigma_1, and brackets of
lambda_max. Each function states what its outcome proves; the error bounds are in
:mod:`probes.fast.errors`.

Shapes: ``gram`` (t, k, k) float64 Gram matrices G = X_S X_S^T (as stored: both triangles may be read),
``chol`` (t, k, k) their factors, ``info`` / ``pivot`` (t,), vectors (t, k, 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from probes.fast import tuning
from probes.fast.errors import F64_EPS, cholesky_backward, dependence_slack


class Rows:
    """The float64 rows of a batch of matrices, by position in the batch: ``rows(pos)`` gives the (t', m,
    d) rows at ``pos`` (t',); :meth:`times` the products X^T v that the ceilings need, by ``times(pos, v)``
    where given (e.g. one product with the whole pool, :meth:`probes.fast.Pool.times`, instead of a
    gathered copy of every matrix), else from the gathered rows."""

    def __init__(self, take: Callable[[torch.Tensor], torch.Tensor],
                 times: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None):
        self._take, self._times = take, times

    @classmethod
    def of(cls, rows: Rows | Callable[[torch.Tensor], torch.Tensor]) -> Rows:
        """``rows`` itself, or a plain callable (positions -> rows) wrapped."""
        return rows if isinstance(rows, Rows) else cls(rows)

    def __call__(self, pos: torch.Tensor) -> torch.Tensor:
        return self._take(pos)

    @property
    def gathers(self) -> bool:
        """Whether :meth:`times` gathers the rows (no product of its own)."""
        return self._times is None

    def times(self, pos: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(t', d) fl(X^T v) for the matrices at ``pos`` and vectors v (t', m, 1): each entry a sum of the m
        products x_ij v_i in some order, plus exact zeros (so its rounding is bounded as an m-term dot
        product's, Higham eq. 3.11)."""
        if self._times is not None:
            return self._times(pos, v)
        return rows_times(self._take(pos), v)

    def at(self, index: torch.Tensor) -> Rows:
        """The rows of the matrices at ``index`` (t',), by position in ``index``."""
        times = None if self._times is None else (lambda pos, v: self._times(index[pos], v))
        return Rows(lambda pos: self._take(index[pos]), times)


_NORMAL = torch.finfo(torch.float64).tiny  # 2^-1022, the smallest normal float64
_CONVERGED = 1e-12  # power steps stop once two Rayleigh quotients in a row agree this closely (relative)


def shifted_cholesky(gram: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cholesky_ex(G - s I)`` for a batch ((t, k, k), shifts (t,)) without copying G: the diagonal is
    shifted in place and restored bit for bit afterwards."""
    diag = gram.diagonal(dim1=-2, dim2=-1)  # (t, k) view
    saved = diag.clone()
    diag.sub_(shift[:, None])
    try:
        return torch.linalg.cholesky_ex(gram)
    finally:
        diag.copy_(saved)


def pivot_vectors(gram: torch.Tensor, chol: torch.Tensor, pivot: torch.Tensor,
                   candidates: torch.Tensor) -> torch.Tensor:
    """(t, k, 1): v = [-z; 1; 0] with z ~ G_11^-1 g_j at each candidate's failing pivot j, from the
    factor of G_11 - s I (zero elsewhere)."""
    t, k, _ = gram.shape
    if _batched_pivots(gram):  # every matrix at once: no read of its pivots
        cols = torch.arange(k, device=gram.device)[None, :]  # (1, k)
        inside = candidates[:, None] & (cols < pivot[:, None])  # (t, k): the rows before the pivot
        col = gram.gather(2, pivot.clamp(0, k - 1)[:, None, None].expand(t, k, 1))  # (t, k, 1): column j
        z = _leading_solve(chol, inside, torch.where(inside[..., None], col, 0.0))
        at = candidates[:, None] & (cols == pivot[:, None])
        return torch.where(inside[..., None], -z, at[..., None].to(gram.dtype))
    v = torch.zeros(t, k, 1, dtype=gram.dtype, device=gram.device)
    for j in pivot[candidates].unique().tolist():
        group = candidates & (pivot == j)
        pos = slice(None) if bool(group.all()) else group.nonzero().flatten()  # views when all alike
        v[pos, j] = 1.0
        if j > 0:
            l11 = chol[pos, :j, :j]  # only its lower triangle is read
            y = torch.linalg.solve_triangular(l11, gram[pos, :j, j : j + 1], upper=False)
            v[pos, :j] = -torch.linalg.solve_triangular(l11.transpose(1, 2), y, upper=True)
    return v


def _batched_pivots(gram: torch.Tensor) -> bool:
    """Whether :func:`pivot_vectors` and :func:`refine` solve every matrix at once (k x k triangular
    solves with the identity from each pivot on) instead of one group per distinct pivot on its leading
    block: off the CPU, where the groups would read the pivots back to the host and launch a few
    kernels each (up to k groups per chunk), or where ``Tuning.batched_pivots`` asks (tests of that
    route on the CPU). Same vectors up to the rounding of the solves (the bounds that use them are
    rigorous for any vector)."""
    return gram.device.type != "cpu" or tuning.TUNING.batched_pivots


def _leading_solve(chol: torch.Tensor, inside: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(t, k, 1) L_11^-T L_11^-1 b_1 of each matrix's leading block (``inside`` (t, k) bool: the rows
    before its pivot), zero beyond it: both solves on the k x k factor with the identity outside the
    block (``b`` (t, k, 1) zero there; only the lower triangle of ``chol`` is read)."""
    k = chol.shape[-1]
    eye = torch.eye(k, dtype=chol.dtype, device=chol.device)
    lead = torch.where(inside[:, :, None] & inside[:, None, :], chol, eye)  # (t, k, k)
    y = torch.linalg.solve_triangular(lead, b, upper=False)
    return torch.linalg.solve_triangular(lead.transpose(1, 2), y, upper=True)


def refine(gram: torch.Tensor, chol: torch.Tensor, pivot: torch.Tensor, v: torch.Tensor,
            rest: torch.Tensor | None) -> None:
    """One step of iterative refinement of z = G_11^-1 g_j (in place, at positions ``rest``, None: all):
    the error of z shrinks by about s / lambda_min(G_11) per step."""
    if _batched_pivots(gram):  # every matrix at once: no read of its pivots
        sel = slice(None) if rest is None else rest
        g, vv, piv = gram[sel], v[sel], pivot[sel]
        k = g.shape[-1]
        inside = (torch.arange(k, device=g.device)[None, :] < piv[:, None])[..., None]  # (r, k, 1)
        z = torch.where(inside, -vv, 0.0)  # zero from the pivot on
        col = g.gather(2, piv.clamp(0, k - 1)[:, None, None].expand(-1, k, 1))
        dz = _leading_solve(chol[sel], inside[..., 0], torch.where(inside, col - g @ z, 0.0))
        v[sel] = torch.where(inside, -(z + dz), vv)
        return
    piv = pivot if rest is None else pivot[rest]
    groups = piv.unique().tolist()
    for j in groups:
        if j == 0:
            continue
        if rest is None:
            pos = slice(None) if len(groups) == 1 else (pivot == j).nonzero().flatten()
        else:
            pos = rest[piv == j]
        l11, z = chol[pos, :j, :j], -v[pos, :j]
        resid = gram[pos, :j, j : j + 1] - gram[pos, :j, :j] @ z
        y = torch.linalg.solve_triangular(l11, resid, upper=False)
        v[pos, :j] = -(z + torch.linalg.solve_triangular(l11.transpose(1, 2), y, upper=True))


def rayleigh_up(gram: torch.Tensor, v: torch.Tensor, trace: torch.Tensor, width: int, pos,
                 size: int | None = None) -> torch.Tensor:
    """Rigorous upper bound on v^T G v / v^T v at ``pos``, G as stored (both triangles read). ``size``:
    v is zero beyond its first ``size`` entries (only that leading block of G is read)."""
    k, u = gram.shape[-1], F64_EPS / 2
    size = k if size is None else size
    vp = v[pos, :size]
    num = (vp * (gram[pos, :size, :size] @ vp)).sum((1, 2))
    den = (vp * vp).sum((1, 2))
    rounding = (2 * (k + 1) + 2 * width) * u * 1.01 * den * trace[pos]  # products, sums, G vs G^T
    r_up = (num + rounding) / (den * (1 - 2 * k * u))
    return torch.where(torch.isfinite(r_up), r_up, math.inf)


def products(gram: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """G v for a batch, (t, k, k) @ (t, k, 1) -> (t, k, 1) (or one (k, k) matrix and (k, 1)). On the CPU
    from ``Tuning.ceiling_loop_k`` on, one matrix-vector product per matrix on views: a batched product
    with one column runs about 7x slower there (one thread: 0.66 ms against 0.09 ms a matrix at
    k = 768, 1.2 ms against 0.16 ms at k = 1024). Each matrix's product is then the same whatever batch
    it is in."""
    if gram.dim() != 3 or gram.device.type != "cpu" or gram.shape[-1] < tuning.TUNING.ceiling_loop_k:
        return gram @ v
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    for i in range(gram.shape[0]):
        torch.mv(gram[i], v[i, :, 0], out=out[i, :, 0])
    return out


def power_lower(gram: torch.Tensor, steps: int = 4, *, vector: bool = False):
    """(t,) lower bounds on lambda_max(G as stored): the largest diagonal entry and the Rayleigh quotient
    after ``steps`` power steps from the all-ones vector (unit v: <= lambda_max up to rounding, which
    the factor 1 - 4 k eps covers), or fewer where the Rayleigh quotients of every matrix have stopped
    moving (two in a row within ``_CONVERGED``, relative: tokens with a dominant common direction, whose
    first step already lands on the top eigenvector; each step reads the whole batch once, half a
    Cholesky factorisation's time at k = 768). ``vector``: also return the unit vectors v and G v, each
    (t, k, 1). A single (k, k) matrix gives a 0-d bound (matrix-vector products instead of a batched
    product)."""
    k = gram.shape[-1]
    v = torch.ones(*gram.shape[:-1], 1, dtype=gram.dtype, device=gram.device)
    gv, rayleigh = None, None
    for step in range(max(1, steps)):  # (at least one step: v unit)
        w = products(gram, v)
        before, rayleigh = rayleigh, (v.mT @ w)[..., 0, 0] / (1 if step else k)  # (v's Rayleigh quotient)
        if step and bool(((rayleigh - before).abs() <= _CONVERGED * rayleigh.abs()).all()):
            gv = w  # (v unit)
            break
        v = w / w.norm(dim=-2, keepdim=True).clamp(min=torch.finfo(gram.dtype).tiny)
    if gv is None:
        gv = products(gram, v)
        rayleigh = (v.mT @ gv)[..., 0, 0]
    lo = torch.maximum(gram.diagonal(dim1=-2, dim2=-1).amax(-1), rayleigh) * (1 - 4 * k * F64_EPS)
    return (lo, v, gv) if vector else lo


def rows_times(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(t, d) fl(X^T v) for rows x (t, m, d) and vectors v (t, m, 1) (as a batched product v^T X, far
    faster than X^T v)."""
    return (v.transpose(1, 2) @ x)[:, 0]


def rows_rayleigh_up(x: torch.Tensor, v: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """(t,) rigorous upper bounds on |X^T v|^2 / |v|^2 >= lambda_min(X X^T), X = ``x`` (t, m, d) the
    float64 rows themselves, v (t, m, 1), ``norms`` (t, m) upper bounds on the row norms
    (:func:`rayleigh_up_of_product` of the product computed here)."""
    return rayleigh_up_of_product(rows_times(x, v), v, norms)


def rayleigh_up_of_product(y: torch.Tensor, v: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
    """(t,) rigorous upper bounds on |X^T v|^2 / |v|^2 >= lambda_min(X X^T) from y = fl(X^T v) (t, d),
    each entry computed as a dot product of m terms (plus exact zeros), v (t, m, 1), ``norms`` (t, m) upper
    bounds on the norms of the rows of X.

    Unlike a Rayleigh quotient of the Gram matrix, whose rounding (about (k + d) u trace(G)) sets a
    floor far above the smallest eigenvalue of a nearly dependent set, the rounding here enters |X^T v|
    linearly: fl(X^T v) = X^T v + e with |e| <= gamma_m |X|^T |v| elementwise (Higham, Accuracy and
    Stability, eq. 3.11), and | |X|^T |v| | <= sum_i |v_i| |x_i|, so |X^T v| <= |fl(X^T v)| +
    gamma_m sum_i |v_i| |x_i|; each norm and the denominator rounded the safe way (generous factors)."""
    m, d = v.shape[1], y.shape[-1]
    u = F64_EPS / 2
    spread = (v[:, :, 0].abs() * norms).sum(-1) * (1 + 1.02 * (m + 2) * u)  # (t,) >= sum_i |v_i| |x_i|
    # underflow (flush-to-zero included) adds at most 2^-1022 per operation: (m + d + 2) of them per entry
    floor = (m + d + 2) * d**0.5 * _NORMAL
    num = torch.linalg.vector_norm(y, dim=-1) * (1 + 1.01 * (d + 2) * u) + 1.02 * m * u * spread + floor
    den = (v * v).sum((1, 2)) * (1 - 1.01 * (m + 1) * u)
    r_up = (num**2 / den * (1 + 1e-12)).clamp(min=4 * _NORMAL)  # (raising an upper bound keeps it one)
    return torch.where(torch.isfinite(r_up) & (den > 0), r_up, math.inf)


def _rows_bound(rows: Rows, v: torch.Tensor, pos: torch.Tensor, diag: torch.Tensor, width: int,
                chunk_bytes: int = 4 * 2**20) -> torch.Tensor:
    """:func:`rayleigh_up_of_product` of the rows at ``pos`` (each m x ``width``, m the length of v) and
    vectors v (t, m, 1). Where ``rows`` gathers them, in pieces of about ``chunk_bytes`` of rows (small
    enough that the product reads them from cache: at k = d = 768, one matrix a piece, gathering and
    reading three 4.7 MB matrices took 3.1 ms, one at a time 1.9 ms). ``diag`` (t, m): the Gram
    diagonals, whose square roots (raised by the rounding of a float64 dot product) bound the row
    norms."""
    rows, (m, d) = Rows.of(rows), (v.shape[1], width)
    # (t, m) >= |x_i|, also where a row's squares underflowed (at most 2^-1022 each)
    norms = (diag[:, :m] * (1 + 1.01 * (d + 2) * F64_EPS) + d * _NORMAL).sqrt() * (1 + F64_EPS)
    step = max(1, chunk_bytes // max(1, m * d * 8)) if rows.gathers else max(1, pos.numel())
    out = []
    for a in range(0, pos.numel(), step):
        part = slice(a, a + step)
        out.append(rayleigh_up_of_product(rows.times(pos[part], v[part]), v[part], norms[part]))
    return torch.cat(out)


def pivot_ceilings(gram: torch.Tensor, chol: torch.Tensor, pivot: torch.Tensor, pos: torch.Tensor,
                   trace: torch.Tensor, width: int, *, v: torch.Tensor | None = None,
                   r_up: torch.Tensor | None = None, pre: int = 0, lam_lo: torch.Tensor | None = None,
                   rows: Rows | None = None, enough: float = 0.0) -> torch.Tensor:
    """Proven ceilings on sigma_k / sigma_1 of the rows at ``pos``: sqrt(R / lam_lo) with R the smaller
    Rayleigh bound of the pivot vector v before and after one more refinement step (R >= lambda_min),
    lam_lo <= lambda_max (:func:`power_lower`, two steps, unless given at ``pos``), and the error of
    forming G (|G - X X^T|_2 <= gamma_d trace) on both sides. ``v`` (t, k, 1) and ``r_up`` (the bound of
    v as it is, at ``pos``): the pivot vectors, if computed already; None: computed here from the factors
    ``chol`` failing at ``pivot``, with ``pre`` refinement steps first. ``rows``: positions -> their
    float64 rows (c, m, d), m the length of v: then R is also bounded from the rows themselves
    (:func:`rows_rayleigh_up`), far tighter where the rows are nearly dependent; only where the Gram
    route's ceiling exceeds ``enough`` (the rows' bound reads k x d rows).

    From ``Tuning.ceiling_loop_k`` on (CPU), matrix by matrix on views of the batch: matrix-vector
    products and triangular solves, instead of batched products with one column (several times slower
    there) on gathered copies; the factors at ``pos`` are then overwritten from their pivot on
    (:func:`_leading_factor`). The bounds are the same; the refined vectors, and so the ceilings, differ
    between the two by their rounding (on nearly dependent rows about 1e-8 relative, either way)."""
    k = gram.shape[-1]
    if gram.device.type == "cpu" and k >= tuning.TUNING.ceiling_loop_k:
        v, best, lam_lo = _refined_each(gram, chol, pivot, pos, trace, width, v, r_up, pre, lam_lo)
        diag, trace = gram.diagonal(dim1=-2, dim2=-1)[pos], trace[pos]
    else:
        if v is None:
            cand = torch.zeros(gram.shape[0], dtype=torch.bool, device=gram.device)
            cand[pos] = True
            v = pivot_vectors(gram, chol, pivot, cand)
            for _ in range(pre):  # (each step shrinks the error of v by about s / lambda_min(G_11))
                refine(gram, chol, pivot, v, pos)
            r_up = rayleigh_up(gram, v, trace, width, pos)
        gram, chol, pivot, v, trace = gram[pos], chol[pos], pivot[pos], v[pos], trace[pos]  # one copy each
        refine(gram, chol, pivot, v, None)
        best = torch.minimum(r_up, rayleigh_up(gram, v, trace, width, slice(None)))
        if lam_lo is None:
            lam_lo = power_lower(gram, steps=2)
        diag = gram.diagonal(dim1=-2, dim2=-1)
    err = 2.02 * width * F64_EPS * trace
    top = (best + err).clamp(min=0)
    bottom = lam_lo * (1 - 4 * k * F64_EPS) - err
    out = torch.sqrt(top / bottom.clamp(min=torch.finfo(torch.float64).tiny)) * (1 + 1e-12)
    if rows is not None:  # the rows' bound where the Gram route's is not below ``enough``
        loose = (~(out <= enough)).nonzero().flatten()
        if loose.numel():
            tight = _rows_bound(rows, v[loose], pos[loose], diag[loose], width)
            out[loose] = torch.minimum(out[loose], torch.sqrt(tight / bottom[loose].clamp(
                min=torch.finfo(torch.float64).tiny)) * (1 + 1e-12))
    return torch.where((bottom > 0) & torch.isfinite(out), out.clamp(max=1.0), 1.0)


def _refined_each(gram: torch.Tensor, chol: torch.Tensor, pivot: torch.Tensor, pos: torch.Tensor,
                  trace: torch.Tensor, width: int, v: torch.Tensor | None, r_up: torch.Tensor | None,
                  pre: int, lam_lo: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Gram route of :func:`pivot_ceilings`, matrix by matrix on views (2-D kernels): the refined
    vectors (n, k, 1) of the matrices at ``pos``, the smaller Rayleigh bound R (n,) and lam_lo (n,)."""
    n, k = pos.numel(), gram.shape[-1]
    vs = torch.zeros(n, k, 1, dtype=gram.dtype, device=gram.device)
    best = torch.empty(n, dtype=gram.dtype, device=gram.device)
    lam = torch.empty(n, dtype=gram.dtype, device=gram.device) if lam_lo is None else lam_lo
    for a, (i, j) in enumerate(zip(pos.tolist(), pivot[pos].tolist(), strict=True)):
        g, w = gram[i], vs[a]  # (k, k), (k, 1) views
        lo = _leading_factor(chol[i], j)
        if v is None:
            _vector_one(g, lo, j, w)
            for _ in range(pre):
                _refine_one(g, lo, j, w)
            first = _rayleigh_one(g, w, trace[i], width, j)
        else:
            w.copy_(v[i])
            first = r_up[a]
        _refine_one(g, lo, j, w)
        best[a] = torch.minimum(first, _rayleigh_one(g, w, trace[i], width, j))
        if lam_lo is None:
            lam[a] = power_lower(g, steps=2)
    return vs, best, lam


def _leading_factor(chol: torch.Tensor, j: int) -> torch.Tensor:
    """A factor that solves with L11, the leading j x j block of ``chol`` (k, k), without a solve on a
    strided view (torch copies such a view, transposed, for each solve: several times slower than the
    solve). Where the block is at least half of a column-major factor: the factor itself, its diagonal
    from j on set to 1 (in place: its rows from j on are not part of L11), which :func:`_cho_solve`
    uses with right-hand sides zero from j on; otherwise the block copied column-major (j, j)."""
    k = chol.shape[-1]
    if 2 * j >= k and chol.mT.is_contiguous():
        chol.diagonal()[j:] = 1.0
        return chol
    return chol[:j, :j].mT.contiguous().mT


def _cho_solve(lo: torch.Tensor, j: int, b: torch.Tensor) -> torch.Tensor:
    """(j, 1) L11^-T L11^-1 b for b (j, 1), ``lo`` from :func:`_leading_factor`. With the whole factor
    (k, k): forward substitution on [b; 0] gives [L11^-1 b; y2] (its first j entries read only L11),
    and back substitution on [L11^-1 b; 0] gives [L11^-T L11^-1 b; 0] (entries from j on are 0 / 1 and
    add exact zeros above)."""
    if lo.shape[0] == j:
        y = torch.linalg.solve_triangular(lo, b, upper=False)
        return torch.linalg.solve_triangular(lo.mT, y, upper=True)
    y = torch.zeros(lo.shape[0], 1, dtype=b.dtype, device=b.device)
    y[:j] = b
    y = torch.linalg.solve_triangular(lo, y, upper=False)
    y[j:] = 0.0
    return torch.linalg.solve_triangular(lo.mT, y, upper=True)[:j]


def _vector_one(g: torch.Tensor, lo: torch.Tensor, j: int, out: torch.Tensor) -> None:
    """:func:`pivot_vectors` of one matrix g (k, k) whose factorisation failed at pivot j, from
    :func:`_leading_factor`, into ``out`` (k, 1), zero."""
    out[j] = 1.0
    if j > 0:
        out[:j] = -_cho_solve(lo, j, g[:j, j : j + 1].contiguous())


def _refine_one(g: torch.Tensor, lo: torch.Tensor, j: int, v: torch.Tensor) -> None:
    """:func:`refine` of one matrix (in place on v (k, 1)), ``lo`` as in :func:`_vector_one`."""
    if j == 0:
        return
    z = -v[:j]
    resid = g[:j, j : j + 1] - g[:j, :j] @ z
    v[:j] = -(z + _cho_solve(lo, j, resid))


def _rayleigh_one(g: torch.Tensor, v: torch.Tensor, trace: torch.Tensor, width: int, j: int) -> torch.Tensor:
    """:func:`rayleigh_up` of one matrix g (k, k) and vector v (k, 1) zero beyond entry j (0-d)."""
    k, u = g.shape[-1], F64_EPS / 2
    vp = v[: j + 1]
    num = (vp * (g[: j + 1, : j + 1] @ vp)).sum()
    den = (vp * vp).sum()
    rounding = (2 * (k + 1) + 2 * width) * u * 1.01 * den * trace  # as rayleigh_up (k >= the support)
    r_up = (num + rounding) / (den * (1 - 2 * k * u))
    return torch.where(torch.isfinite(r_up), r_up, math.inf)


def quick_dependent(gram: torch.Tensor, chol: torch.Tensor, info: torch.Tensor, lam_hi: torch.Tensor,
                     rtol: float, width: int, candidates: torch.Tensor, ceilings: bool = False,
                    full: tuple[torch.Tensor, torch.Tensor, int] | None = None,
                    rows: Rows | None = None, enough: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(t,) bool: matrices whose stage 1b factorisation is certain to fail, shown from a failed stage 1
    factorisation of the same G (shift s, failure at pivot j), without running stage 1b; and (t,) a
    proven ceiling on sigma_k / sigma_1 of those matrices (1 elsewhere; only with ``ceilings``).

    The factored leading block gives the vector v = [-G_11^-1 g_j; 1; 0] (for a subset whose first j
    rows are dependent, their null vector), computed with the factor of G_11 - s I and two steps of
    refinement. Its Rayleigh
    quotient R = v^T G v / v^T v >= lambda_min(G), evaluated in float64 with a bound on the rounding
    (and on the asymmetry of G's two triangles), is compared with a lower bound s_lo of the stage 1b
    shift (the same formula, with lam_lo replaced by the largest of the diagonal and the Rayleigh
    quotient of the all-ones vector, both below the power-iteration value). Had the stage 1b
    factorisation of G - s_1b I succeeded, Higham's backward error bound (Thm 10.3) would give
    lambda_min(G) >= s_1b - 4 ((k + 2) u trace(G) + u (max g_ii + lam_hi)); so R below s_lo minus that
    much means it fails: the matrix is dependent (R < tol^2) and is exactly one stage 1b would prove.
    The ceiling: :func:`pivot_ceilings`.

    ``full``: (trace, largest diagonal entry, k) of the whole matrices when ``gram`` (and ``chol``,
    ``info``) hold only their leading m x m blocks (:meth:`Pool.dependent_lead`); ``lam_hi`` must
    then be at least the bound stage 1b computes from the whole matrix. The bounds use the whole
    matrix's values; the tested vector is zero beyond row m, and the ceilings use the largest diagonal
    entry for lambda_max (no power steps on the whole matrix). ``rows``, ``enough``: see
    :func:`pivot_ceilings`.
    """
    t, m, _ = gram.shape
    u = F64_EPS / 2
    pivot = info.to(torch.int64) - 1  # the failing pivot, 0-based = columns factored before it
    candidates = candidates & (info > 0) & (pivot < m)
    ceiling = torch.ones(t, dtype=gram.dtype, device=gram.device)
    if not bool(candidates.any()):
        return candidates, ceiling
    if full is None:
        diag = gram.diagonal(dim1=-2, dim2=-1)
        trace, dmax, k = diag.sum(-1), diag.amax(-1), m
    else:
        trace, dmax, k = full
    gamma = dependence_slack(dmax, lam_hi, width, k, trace)  # as stage 1b
    backward = cholesky_backward(k, trace, dmax, lam_hi)

    def threshold(lam_lo: torch.Tensor) -> torch.Tensor:  # (lower bound of the 1b shift) - backward
        s_lo = (rtol**2 * lam_lo * (1 - 4 * k * F64_EPS) - gamma) * (1 - 1e-12)
        return torch.where(s_lo > 0, s_lo - backward, -math.inf)

    bound = threshold(dmax)  # lam_lo >= the largest diagonal entry
    v = pivot_vectors(gram, chol, pivot, candidates)
    size = int(pivot[candidates].max()) + 1  # v is zero beyond
    r_up = rayleigh_up(gram, v, trace, width, slice(None), size)
    for _ in range(2):  # refinement where needed
        rest = (candidates & (pivot > 0) & ~(r_up < bound)).nonzero().flatten()
        if not rest.numel():
            break
        refine(gram, chol, pivot, v, rest)
        r_up[rest] = rayleigh_up(gram, v, trace, width, rest, size)
    ok = candidates & (r_up < bound)
    if full is None and bool((candidates & ~ok).any()):  # lam_lo >= the Rayleigh quotient of 1 too
        ones = (gram.sum((-2, -1)) - 1.01 * k**3 * u * trace) / k * (1 - 1e-10)  # (rounded down)
        ok = candidates & (r_up < threshold(torch.maximum(dmax, ones)))
    if ceilings and bool(ok.any()):  # (from a leading block: lambda_max >= the largest diagonal entry)
        pos = ok.nonzero().flatten()
        ceiling[pos] = pivot_ceilings(gram, chol, pivot, pos, trace, width, v=v, r_up=r_up[pos],
                                      lam_lo=None if full is None else dmax[pos], rows=rows, enough=enough)
    return ok, ceiling


def exposed_ceilings(gram: torch.Tensor, shift: torch.Tensor, width: int, rows: Rows) -> torch.Tensor:
    """(t,) proven ceilings on sigma_k / sigma_1 (1 where none): where the Cholesky factorisation of
    G - s I (``shift`` (t,)) fails at pivot j, the vector it exposes (for rows 0 .. j dependent up to
    the shift, their null vector) is refined (three steps) and bounded from the rows themselves
    (:func:`pivot_ceilings`). Unlike a dependence proof this needs no room below a tolerance: the
    shift only chooses which vector is exposed, and the ceiling holds whatever that vector is, so it
    reaches below the Gram route's resolution where the rows are dependent up to rounding."""
    t, k, _ = gram.shape
    ceiling = torch.ones(t, dtype=gram.dtype, device=gram.device)
    chol, info = shifted_cholesky(gram, shift.clamp(min=0))
    pivot = info.to(torch.int64) - 1
    cand = (info > 0) & (pivot < k)
    if bool(cand.any()):
        trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
        ceiling[cand] = pivot_ceilings(gram, chol, pivot, cand.nonzero().flatten(), trace, width, pre=2,
                                       rows=rows)
    return ceiling


def tight_lambda_max(gram: torch.Tensor, steps: int = 12, gap: float = 1e-3,
                      residual: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) with lo <= lambda_max(G as stored) <= hi, hi = inf where not proven.

    lo: :func:`power_lower` after ``steps`` power steps (theta). hi: mu = theta (1 + gap), or with
    ``residual`` mu = max(theta (1 + gap), theta + 2 |G v - theta v|) for the unit power vector v (where
    the power steps have not converged, theta (1 + gap) is often below lambda_max and proves nothing;
    the residual says by about how much), proven when
    the Cholesky factorisation of mu I - G succeeds: then L L^T = mu I - G + E with |E|_2 <=
    gamma_{k+1} / (1 - gamma_{k+1}) trace(mu I - G) <= 1.01 (k + 1) u k mu (Higham, Thm 10.3), plus
    u mu for rounding the diagonal, so lambda_max(G) <= mu (1 + 1.01 (k + 1) u k + 2 u)."""
    t, k, _ = gram.shape
    u = F64_EPS / 2
    if residual:
        lo, v, gv = power_lower(gram, steps, vector=True)
    else:
        lo = power_lower(gram, steps)
    theta = lo / (1 - 4 * k * F64_EPS)
    mu = theta * (1 + gap)
    if residual:
        rho = torch.linalg.vector_norm(gv - theta[:, None, None] * v, dim=(1, 2))
        mu = torch.maximum(mu, theta + 2 * rho)
    a = gram.neg()
    a.diagonal(dim1=-2, dim2=-1).add_(mu[:, None])
    _, info = torch.linalg.cholesky_ex(a)
    hi = mu * (1 + 1.01 * (k + 1) * u * k + 2 * u) * (1 + 1e-12)
    return lo, torch.where((info == 0) & (mu > 0) & torch.isfinite(mu), hi, math.inf)


def prove_dependent(gram: torch.Tensor, lam_hi: torch.Tensor, rtol: float, width: int, *,
                    ceilings: bool = False, lam_lo: torch.Tensor | None = None,
                    rows: Rows | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(t,) bool: True where lambda_min(G) < (rtol sigma_max)^2 is proven by a failing Cholesky; and,
    with ``ceilings``, (t,) proven ceilings on sigma_k / sigma_1 of those matrices (1 elsewhere) from
    the vector the failed factorisation exposes (:func:`pivot_ceilings`), else None.

    lam_lo: the largest of the diagonal and a Rayleigh quotient after a few power steps (both
    <= lambda_max, so tol_lo <= tol), unless given (stage 1c gives a tighter one). Cholesky of
    A = G - s I fails in floating point only when lambda_min(A) <= k (k + 1) u max_i a_ii (Demmel); the
    shift s leaves that much room, plus the error of forming G, below tol_lo^2
    (:func:`probes.fast.errors.dependence_slack`). ``rows``: see :func:`pivot_ceilings`.
    """
    t, k, _ = gram.shape
    diag = gram.diagonal(dim1=-2, dim2=-1)  # (t, k)
    if lam_lo is None:
        lam_lo = power_lower(gram)
    gamma = dependence_slack(diag.amax(-1), lam_hi, width, k, diag.sum(-1))
    shift = rtol**2 * lam_lo - gamma  # (t,)
    chol, info = shifted_cholesky(gram, shift.clamp(min=0))
    dep = (info != 0) & (shift > 0)
    if not ceilings:
        return dep, None
    ceiling = torch.ones(t, dtype=gram.dtype, device=gram.device)
    pivot = info.to(torch.int64) - 1
    cand = dep & (info > 0) & (pivot < k)
    if bool(cand.any()):
        pos = cand.nonzero().flatten()
        ceiling[pos] = pivot_ceilings(gram, chol, pivot, pos, diag.sum(-1), width, lam_lo=lam_lo[pos],
                                      rows=rows)
    return dep, ceiling

