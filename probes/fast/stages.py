"""The stages of :func:`decide`: ranks and margins of a batch of Gram matrices, each stage deciding
only what it can prove (see :mod:`probes.fast` for the list). The stages share one explicit state
(:class:`_State`): the outcome so far (:class:`Decisions`), the bounds on lambda_max, and the matrices
held back for exact ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from probes.fast import tuning as tuning_module
from probes.fast.errors import F64_EPS, cholesky_backward, floor_target, gram_error, lam_hi_bound
from probes.fast.kernels import (
    Rows,
    power_lower,
    prove_dependent,
    quick_dependent,
    shifted_cholesky,
    tight_lambda_max,
)
from probes.fast.threads import eigvalsh, spread
from probes.fast.tuning import Tuning
from probes.rank import margins_from_singular_values

STAGE_KEYS = ("cholesky", "cholesky_dependent", "eigvalsh", "svd", "cholesky32")


@dataclass
class Decisions:
    """Per-matrix outcome: rank (S,), margin (S,) in decades (a lower bound where certified), and how
    many matrices each stage decided (``cholesky32``: stage 0, float32). A matrix proven rank-deficient
    without an exact rank (stage 1b) has rank -1 and margin NaN. ``bound`` (S,) bool: True where the
    margin is a certified lower bound (stages 0 and 1), False where it is exact (stages 2 and 3) or NaN."""

    rank: torch.Tensor
    margin: torch.Tensor
    stages: dict[str, int]
    shortcut: int = 0  # of the ``cholesky_dependent`` ones, how many the stage 1b shortcut settled
    bound: torch.Tensor | None = None
    ceiling: torch.Tensor | None = None  # (S,) proven ceiling >= sigma_k / sigma_1 (inf: none known);
    # from the stage 1b shortcut and from the exact spectra (stages 2 and 3), only where asked for
    fail_at: torch.Tensor | None = None  # (S,) int64: for matrices the shortcut settled, the 1-based pivot
    # at which the factorisation it used failed (0 elsewhere); plans stage 0b of later chunks
    floor: torch.Tensor | None = None  # (S,) proven lower bound <= sigma_k / sigma_1 from the exact spectra
    # (stages 2 and 3; 0 elsewhere), where ceilings are asked for
    dip_tried: int = 0  # matrices stage 1b first tried to prove dependent at the dip (see :func:`decide`) ...
    dip_proven: int = 0  # ... and of those, how many it proved

    @classmethod
    def empty(cls, c: int, k: int, device: torch.device, *, ceilings: bool) -> Decisions:
        """Every matrix full rank with margin inf (to be overwritten by the stages)."""
        return cls(torch.full((c,), k, dtype=torch.int64, device=device),
                   torch.full((c,), math.inf, dtype=torch.float64, device=device), new_stages(),
                   bound=torch.zeros(c, dtype=torch.bool, device=device),
                   ceiling=(torch.full((c,), math.inf, dtype=torch.float64, device=device) if ceilings
                            else None),
                   fail_at=torch.zeros(c, dtype=torch.int64, device=device),
                   floor=torch.zeros(c, dtype=torch.float64, device=device) if ceilings else None)


def new_stages() -> dict[str, int]:
    return dict.fromkeys(STAGE_KEYS, 0)


def usable_floor(floor: float | None) -> bool:
    return floor is not None and math.isfinite(floor) and floor >= 0


# ----------------------------------------------------------------------------- certificates (pure)


def floor_certificate(gram: torch.Tensor, lam_hi: torch.Tensor, rtol: float, width: int, floor: float):
    """Stage 1 at the margin floor: the Cholesky factorisation of G - (T + 2 delta) I with
    T = tol_hi^2 10^(2 floor) succeeds  =>  lambda_min(G) > T: full rank, margin >= floor. Returns
    (ok (t,) bool, factors (t, k, k), info (t,))."""
    target = floor_target(rtol**2 * lam_hi, floor)
    chol, info = shifted_cholesky(gram, target + 2 * gram_error(gram, lam_hi, width))
    ok = (info == 0) & (target > 0) & (target < lam_hi)
    return ok, chol, info


def margin_certificate(gram: torch.Tensor, lam_hi: torch.Tensor, rtol: float, width: int):
    """Stage 1: the Cholesky factorisation of G - s I succeeds  =>  lambda_min(G) > s >= tol^2 (full
    rank). Returns (ok, factors, info, margins (ok.sum(),) proven lower bounds of the certified ones).

    Margin: lambda_min(G - sI) >= 1 / trace((G - sI)^-1) = 1 / |L^-1|_F^2, so sigma_k^2 >= s +
    1 / |L^-1|_F^2 and tol^2 <= tol_hi^2."""
    k = gram.shape[-1]
    delta = gram_error(gram, lam_hi, width)
    tol_hi2 = rtol**2 * lam_hi  # (t,) >= tol^2
    shift = tol_hi2 + 2 * delta
    chol, info = shifted_cholesky(gram, shift)  # (t, k, k), (t,)
    ok = (info == 0) & (lam_hi > 0)
    margins = torch.empty(0, dtype=gram.dtype, device=gram.device)
    if bool(ok.any()):
        lc = chol if bool(ok.all()) else chol[ok]  # no copy in the common case
        eye = torch.eye(k, dtype=gram.dtype, device=gram.device)
        inv = torch.linalg.solve_triangular(lc, eye.expand_as(lc), upper=False)  # (c', k, k) = L^-1
        lam_lo = shift[ok] - 2 * delta[ok] + 1.0 / torch.linalg.vector_norm(inv, dim=(-2, -1)) ** 2
        margins = 0.5 * torch.log10(lam_lo / tol_hi2[ok].clamp(min=torch.finfo(gram.dtype).tiny))
    return ok, chol, info, margins


def exact_stage(gram: torch.Tensor, todo: torch.Tensor, rows: Rows, lam_hi: torch.Tensor, rtol: float,
                width: int, out: Decisions) -> None:
    """Stage 2 (eigenvalues of G) and stage 3 (float64 SVD of X_S where stage 2 is ambiguous), written
    into ``out`` at ``todo``.

    ``out.ceiling``, if not None, receives a proven upper bound on sigma_k / sigma_1 from the same
    spectra: sqrt((lambda_k + 2 delta) / (lambda_1 - 2 delta)) with delta the error bound of the Gram
    route (stage 2), (s_k + e) / (s_1 - e) with e = (k + d) eps s_1 for the SVD (stage 3); and
    ``out.floor`` the proven lower bound sqrt((lambda_k - 2 delta) / (lambda_1 + 2 delta)), or
    (s_k - e) / (s_1 + e)."""
    k, tiny = gram.shape[-1], torch.finfo(gram.dtype).tiny
    lam = spread(eigvalsh, gram).flip(-1).clamp(min=0)  # (t, k) descending
    lam_max = lam[:, 0]
    tol2 = rtol**2 * lam_max
    err = gram_error(gram, lam_hi, width)
    ambiguous = ((lam - tol2[:, None]).abs() <= 2 * err[:, None]).any(-1) & (lam_max > 0)
    sv = lam.sqrt()
    r2, m2 = margins_from_singular_values(sv, rtol * sv[:, 0])
    ok = ~ambiguous
    loose, m_lo = _unresolved_margins(lam, r2, err, rtol)
    out.rank[todo[ok]] = r2[ok]
    out.margin[todo[ok]] = torch.where(loose, m_lo, m2)[ok]
    out.bound[todo[ok]] = loose[ok]
    out.stages["eigvalsh"] += int(ok.sum())
    if out.ceiling is not None:
        bottom = lam_max - 2 * err
        up = torch.sqrt((lam[:, -1] + 2 * err) / bottom.clamp(min=tiny)) * (1 + 1e-12)
        out.ceiling[todo] = torch.where((bottom > 0) & torch.isfinite(up), up.clamp(max=1.0), 1.0)
        low = torch.sqrt((lam[:, -1] - 2 * err).clamp(min=0) / (lam_max + 2 * err)) * (1 - 1e-12)
        out.floor[todo] = torch.where(torch.isfinite(low), low, 0.0)
    hard = todo[ambiguous]
    if hard.numel():
        sv3 = spread(torch.linalg.svdvals, rows(hard))  # (h, k)
        out.rank[hard], out.margin[hard] = margins_from_singular_values(sv3, rtol * sv3[:, 0])
        out.bound[hard] = False
        out.stages["svd"] += int(hard.numel())
        if out.ceiling is not None:
            e = (k + width) * F64_EPS * sv3[:, 0]
            bottom = sv3[:, 0] - e
            up = (sv3[:, k - 1] + e) / bottom.clamp(min=tiny) * (1 + 1e-12)
            out.ceiling[hard] = torch.where((bottom > 0) & torch.isfinite(up), up.clamp(max=1.0), 1.0)
            low = (sv3[:, k - 1] - e).clamp(min=0) / (sv3[:, 0] + e) * (1 - 1e-12)
            out.floor[hard] = torch.where(torch.isfinite(low), low, 0.0)


RESOLVED = 1e-6  # an eigenvalue gives an exact margin where its error band moves sigma by at most this


def _unresolved_margins(lam: torch.Tensor, rank: torch.Tensor, err: torch.Tensor,
                        rtol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the eigenvalues ``lam`` (t, k) descending, each within ``2 err`` (t,) of the exact one, do not
    resolve a margin: (t,) bool, True where a deciding eigenvalue (lambda_r kept, lambda_{r+1} dropped)
    or lambda_1 moves its singular value by more than ``RESOLVED`` (relative) within its band, e.g. a
    dependent matrix's next singular value below about 1e-8 sigma_1, which eigenvalues of G cannot tell
    from 0; and (t,) a proven lower bound on the margin from the ends of the bands (the margin there
    is the SVD's business, see :mod:`probes.robust`)."""
    t, k = lam.shape
    tiny = torch.finfo(lam.dtype).tiny
    band = 2 * err[:, None]  # (t, 1)
    deciding = torch.zeros_like(lam, dtype=torch.bool)
    pos = torch.arange(t, device=lam.device)
    deciding[pos[rank > 0], (rank - 1)[rank > 0]] = True
    deciding[pos[rank < k], rank[rank < k]] = True
    deciding[:, 0] = True
    wide = (lam - band <= 0) | ((lam + band) > (lam - band) * (1 + RESOLVED) ** 2)
    loose = (deciding & wide).any(-1) & (lam[:, 0] > 0)
    tol2_hi, tol2_lo = rtol**2 * (lam[:, 0] + band[:, 0]), rtol**2 * (lam[:, 0] - band[:, 0])
    kept = lam.gather(-1, (rank - 1).clamp(min=0)[:, None])[:, 0]
    dropped = lam.gather(-1, rank.clamp(max=k - 1)[:, None])[:, 0]
    low_kept = (kept - band[:, 0]).clamp(min=tiny) / tol2_hi.clamp(min=tiny)
    low_drop = tol2_lo.clamp(min=tiny) / (dropped + band[:, 0]).clamp(min=tiny)
    m_kept = torch.where(rank > 0, 0.5 * torch.log10(low_kept), math.inf)
    m_drop = torch.where(rank < k, 0.5 * torch.log10(low_drop), math.inf)
    return loose, torch.minimum(m_kept, m_drop).clamp(min=0)


# ----------------------------------------------------------------------------- the state and its stages


@dataclass
class _State:
    """What the stages of one :func:`decide` call share. ``lam_hi`` (c,) is rewritten where a tighter
    bound is proven; ``quick_bound``: it still holds the quick kernel's row sums (see
    :func:`probes.fast.errors.lam_hi_bound`), replaced by the exact-kernel bound where a certificate
    fails."""

    gram: torch.Tensor  # (c, k, k)
    rows: Rows  # positions in 0 .. c - 1 -> their (c', k, d) float64 rows
    rtol: float
    width: int
    lam_cap: float | None
    lam_hi: torch.Tensor  # (c,)
    lam_lo: torch.Tensor | None  # (c,) given lower bounds on lambda_max, or None
    out: Decisions
    prove: bool  # dependence proofs (stage 1b) instead of exact ranks for dependent matrices
    ceilings: bool
    quick_bound: bool
    early: torch.Tensor | None  # (c,) bool: matrices that get exact ranks without a proof first
    tuning: Tuning
    dip: float | None = None  # stage 1b tries this multiplier of rtol first (see :func:`decide`)
    held: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    proven: list[torch.Tensor] = field(default_factory=list)  # positions proven dependent

    def part(self, a: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """a[pos], without a copy while nothing is decided."""
        return a if pos.numel() == a.shape[0] else a[pos]


def _mark_dependent(st: _State, pos: torch.Tensor, ceil: torch.Tensor | None,
                    dep: torch.Tensor | None = None) -> None:
    """Record the matrices at ``pos`` as proven dependent (with ``ceil`` where given); with ``dep`` (a
    mask like ``pos``, ``ceil`` like it too) only those at ``pos[dep]``, written without reading the
    mask on the host (masked writes; the count stays on the device until :func:`_read_counts`)."""
    out = st.out
    if dep is None:
        out.stages["cholesky_dependent"] += int(pos.numel())
        out.rank[pos] = -1
        out.margin[pos] = math.nan
        if out.ceiling is not None and ceil is not None:
            out.ceiling[pos] = ceil
        st.proven.append(pos)
        return
    out.stages["cholesky_dependent"] += dep.sum()
    _set_where(out.rank, pos, dep, -1)
    _set_where(out.margin, pos, dep, math.nan)
    if out.ceiling is not None and ceil is not None:
        _set_where(out.ceiling, pos, dep, ceil)
    st.proven.append(pos)


def _set_where(target: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, value) -> None:
    """``target[pos[mask]] = value[mask]`` (or the number ``value``), as a masked write at ``pos``: no
    host read of ``mask`` (a boolean index would read its count)."""
    target[pos] = torch.where(mask, value, target[pos])


def read_counts(out: Decisions, extra: list[torch.Tensor] | None = None) -> list[float]:
    """The stage counts (and the shortcut and dip counts) that the stages kept on the device, turned into
    ints in one read back from the device, together with the 0-d tensors ``extra`` (returned as floats:
    float64, exact for counts)."""
    keys = [key for key, value in out.stages.items() if isinstance(value, torch.Tensor)]
    names = [name for name in ("shortcut", "dip_proven") if isinstance(getattr(out, name), torch.Tensor)]
    extra = extra or []
    if not keys and not names and not extra:
        return []
    values = torch.stack([out.stages[key].double() for key in keys]
                         + [getattr(out, name).double() for name in names]
                         + [value.double() for value in extra]).tolist()
    for key, value in zip(keys, values, strict=False):
        out.stages[key] = int(value)
    for name, value in zip(names, values[len(keys):], strict=False):
        setattr(out, name, int(value))
    return values[len(keys) + len(names):]


def _hold(st: _State, todo: torch.Tensor) -> torch.Tensor:
    """Set aside the matrices of ``early`` among ``todo`` for the exact stages; the others go on."""
    if st.early is None or not todo.numel():
        return todo
    mine = st.early[todo]
    if not bool(mine.any()):
        return todo
    st.held = torch.cat([st.held, todo[mine]])
    return todo[~mine]


def _prove(st: _State, todo: torch.Tensor) -> torch.Tensor:
    """Stage 1b: rank deficiency proven by a failing Cholesky factorisation. (A ceiling costs a few
    matrix-vector products: only where k is large enough for that to be small beside it.) With a dip,
    at dip x rtol first (:func:`_prove_at_dip`)."""
    want = st.out.ceiling is not None and st.gram.shape[-1] >= st.tuning.ceil_1b_k
    lam_lo = None if st.lam_lo is None else st.part(st.lam_lo, todo)
    if st.dip is not None and todo.numel():
        if lam_lo is None:  # the bound prove_dependent computes (same kernel, bit for bit)
            lam_lo = power_lower(st.part(st.gram, todo))
        todo, lam_lo = _prove_at_dip(st, todo, lam_lo, want)
        if not todo.numel():
            return todo
    dep, ceil = prove_dependent(st.part(st.gram, todo), st.part(st.lam_hi, todo), st.rtol, st.width,
                                ceilings=want, lam_lo=lam_lo, rows=st.rows.at(todo))
    _mark_dependent(st, todo, ceil if want else None, dep)
    return todo[~dep]


def _prove_at_dip(st: _State, todo: torch.Tensor, lam_lo: torch.Tensor,
                  want: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1b at t = dip x rtol (< rtol): the factorisation of G - s' I with s' = t^2 lam_lo - gamma
    (the stage 1b shift at t) fails => lambda_min(G) < t^2 lambda_max, the matrix is dependent at t,
    its ratio below t (the ceiling it gets). It is then also exactly a matrix that stage 1b proves
    dependent at rtol: that factorisation (shift s, same lam_lo and gamma) failing at s' means
    lambda_min(G) <= s' + k (k + 1) u max g_ii (Demmel, doubled here), while had the one at s
    succeeded, lambda_min(G) >= s - :func:`probes.fast.errors.cholesky_backward`; where
    s' + that < s - backward the two cannot both hold, so it fails too. Matrices without that room
    go on to stage 1b at rtol. Returns (what is left, its lam_lo)."""
    g, lam_hi = st.part(st.gram, todo), st.part(st.lam_hi, todo)
    t = st.rtol * st.dip
    dep, ceil = prove_dependent(g, lam_hi, t, st.width, ceilings=want, lam_lo=lam_lo,
                                rows=st.rows.at(todo))
    k, u = g.shape[-1], F64_EPS / 2
    diag = g.diagonal(dim1=-2, dim2=-1)
    trace, dmax = diag.sum(-1), diag.amax(-1)
    room = ((st.rtol**2 - t**2) * lam_lo * (1 - 4 * k * F64_EPS) * (1 - 1e-12)
            - 2 * k * (k + 1) * u * dmax - cholesky_backward(k, trace, dmax, lam_hi))
    dep &= room > 0
    st.out.dip_tried += int(todo.numel())
    st.out.dip_proven += dep.sum()
    top = torch.full_like(lam_lo, t)
    _mark_dependent(st, todo, torch.minimum(ceil, top) if want else top, dep)
    left = (~dep).nonzero().flatten()  # (one host read: the matrices left)
    return todo[left], lam_lo[left]


def _at_floor(st: _State, g, todo, lam_hi, floor: float):
    """Stage 1 at a margin floor (or the reach), written into the outcome."""
    ok, chol, info = floor_certificate(g, lam_hi, st.rtol, st.width, floor)
    _set_where(st.out.rank, todo, ok, g.shape[-1])
    _set_where(st.out.margin, todo, ok, floor)
    st.out.stages["cholesky"] += ok.sum()
    return ok, chol, info


def _with_margin(st: _State, g, todo, lam_hi):
    """Stage 1 with a margin bound of its own for every certified matrix, written into the outcome."""
    ok, chol, info, margins = margin_certificate(g, lam_hi, st.rtol, st.width)
    if margins.numel():
        st.out.margin[todo[ok]] = margins
    st.out.stages["cholesky"] += ok.sum()
    return ok, chol, info


def _certify(st: _State, stage, todo: torch.Tensor, *args, quick: bool = True) -> torch.Tensor:
    """A stage 1 variant on ``todo``; where its factorisation failed, the stage 1b shortcut may settle
    the matrix. Returns what is left."""
    g = st.part(st.gram, todo)
    ok, chol, info = stage(st, g, todo, st.part(st.lam_hi, todo), *args)
    _set_where(st.out.bound, todo, ok, True)
    failed = (~ok).nonzero().flatten()  # (one host read: where the factorisation failed)
    if not failed.numel():
        return failed
    if st.quick_bound:  # from here on, the exact bound of the other stages
        st.quick_bound = False
        every = failed.numel() == todo.numel()
        st.lam_hi[todo[failed]] = lam_hi_bound(g if every else g[failed], st.lam_cap)
    if st.prove and quick:
        candidates = ~ok if st.early is None else ~ok & ~st.early[todo]  # (early ones: exact ranks instead)
        settled, ceil = quick_dependent(g, chol, info, st.part(st.lam_hi, todo), st.rtol, st.width,
                                        candidates, st.ceilings, rows=st.rows.at(todo),
                                        enough=st.rtol * st.tuning.ceiling_enough)
        _mark_dependent(st, todo, ceil, settled)
        _set_where(st.out.fail_at, todo, settled, info.to(torch.int64))
        st.out.shortcut += settled.sum()
        return todo[~(ok | settled)]
    return todo[failed]


def _tighten(st: _State, todo: torch.Tensor) -> torch.Tensor:
    """Stage 1c: what neither the certificate nor the proof decided lies in the band that the gap
    between lam_lo and lam_hi leaves; bracket lambda_max to about 0.1% and try both again."""
    lo, hi = tight_lambda_max(st.part(st.gram, todo))
    ok = hi < st.part(st.lam_hi, todo)
    if not bool(ok.any()):
        return todo
    st.lam_hi[todo[ok]] = hi[ok]
    cand, lo = todo[ok], lo[ok]
    rest = _certify(st, _with_margin, cand)
    if st.prove and rest.numel():
        dep, _ = prove_dependent(st.gram[rest], st.lam_hi[rest], st.rtol, st.width,
                                 lam_lo=lo[torch.isin(cand, rest)])
        _mark_dependent(st, rest[dep], None)
        rest = rest[~dep]
    return torch.cat([todo[~ok], rest]).sort().values


def _certify_and_prove(st: _State, todo: torch.Tensor, floor: float | None, reach: float | None,
                       dependent_first: bool) -> torch.Tensor:
    """Stages 1 and 1b in the planned order; returns what neither decided."""
    if st.prove and dependent_first:
        todo = _prove(st, _hold(st, todo))
    if usable_floor(floor) and todo.numel():
        # certify at the floor first; what fails there is mostly dependent, so stage 1b comes next
        if reach is not None and reach > floor:  # (what fails here is tried again at the floor)
            todo = _certify(st, _at_floor, todo, reach, quick=False)
        if todo.numel():
            todo = _hold(st, _certify(st, _at_floor, todo, floor))
        if st.prove and not dependent_first and todo.numel():
            todo = _prove(st, todo)
        if st.prove and todo.numel() and floor > 0:  # (without proofs, stage 2 settles the rest exactly
            todo = _certify(st, _with_margin, todo)  # anyway; at floor 0 it would repeat the floor stage)
        return todo
    if todo.numel():
        todo = _hold(st, _certify(st, _with_margin, todo))
    if st.prove and not dependent_first and todo.numel():
        todo = _prove(st, todo)
    return todo


def decide(
    gram: torch.Tensor,
    rows: Rows,
    rtol: float,
    width: int,
    *,
    lam_cap: float | None = None,
    exact_dependent: int | None = None,
    dependent_first: bool = False,
    floor: float | None = None,
    reach: float | None = None,
    ceilings: bool = False,
    exact_first: torch.Tensor | None = None,
    lam_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    dip: float | None = None,
    defer_counts: bool = False,
) -> Decisions:
    """Ranks and margins of c matrices given their Gram matrices (stages 1 to 3).

    Args:
        gram: (c, k, k) float64 Gram matrices X_S X_S^T (the diagonal is used as scratch and restored).
        rows: callable taking a LongTensor of positions in 0..c-1 and returning the matching (c', k, d)
            float64 matrices X_S (only called for the few that need the exact SVD).
        rtol: relative tolerance (singular values above ``rtol * sigma_max`` count).
        width: d, the row width (enters the float64 error bound of the Gram route).
        lam_cap: a known upper bound on every lambda_max, e.g. sigma_1^2 of the pool the rows come
            from (interlacing); tightens stage 1.
        exact_dependent: None to compute the exact rank of every matrix; an integer to prove rank
            deficiency by stage 1b and compute exact ranks for the first this many dependent matrices
            (in order; besides those the exact stages decide anyway).
        dependent_first: run stage 1b before stage 1 (pays off when most matrices are dependent);
            without dependence proofs (``exact_dependent`` None: exact ranks for every matrix), go
            straight to the exact stages instead (a dependent matrix would pay a failed certificate, a
            lambda_max bracket and a second certificate before its eigenvalues).
        floor: a margin (decades) to certify at: matrices whose factorisation succeeds with the shift
            raised to it are credited with this margin, without a margin bound of their own (see
            :mod:`probes.fast`). None: a margin bound for every certified matrix.
        reach: with a floor, certify at this larger margin first (matrices that pass are credited with
            it; the others go on at the floor). Ranks do not depend on it; it spares later proofs that a
            matrix stays full rank at a larger tolerance (:mod:`probes.robust`).
        ceilings: also give the matrices that the stage 1b shortcut proves dependent a proven ceiling
            on sigma_k / sigma_1 (``Decisions.ceiling``, inf elsewhere): a refinement step and two power
            steps on the vector the shortcut already has; matrices decided from exact spectra (stages 2
            and 3) get one from those spectra, and from ``Tuning.ceil_1b_k`` on, stage 1b proper too.
        exact_first: (c,) bool, or None: matrices that get an exact rank if they are dependent (the
            first of the rank histogram): the certificates are tried as usual, but where they fail the
            matrix goes straight to the exact stages, without a dependence proof first.
        lam_bounds: (lo, hi), each (c,): proven bounds lo <= lambda_max <= hi of each matrix (hi inf
            where unknown), e.g. from :func:`probes.fast.tight_lambda_max`; they replace the usual
            bounds where tighter, and stage 1c is skipped.
        dip: with dependence proofs, a multiplier of rtol below 1 (the robustness grid's lowest point):
            stage 1b first tries to prove each matrix dependent at dip x rtol, which proves it dependent
            at rtol exactly as stage 1b would, and (with ``ceilings``) gives it the ceiling dip x rtol,
            so that the grid need not prove it again there. Ranks do not depend on it.
        defer_counts: leave the counts the stages keep on the device (``stages``, ``shortcut``,
            ``dip_proven``) as 0-d tensors, for the caller to read with its own (:func:`read_counts`);
            else they are read back once, at the end.
    """
    c, k, _ = gram.shape
    out = Decisions.empty(c, k, gram.device, ceilings=ceilings)
    if c == 0:
        return out
    prove = exact_dependent is not None and k > 1
    quick = usable_floor(floor) and not (prove and dependent_first) and lam_bounds is None
    lam_lo = None
    if lam_bounds is not None:
        lam_lo, known = lam_bounds
        lam_hi = torch.minimum(lam_hi_bound(gram, lam_cap), known)
    else:
        lam_hi = lam_hi_bound(gram, lam_cap, quick=quick)  # exact bound recomputed after the floor stage
    early = exact_first if prove and exact_first is not None and bool(exact_first.any()) else None
    st = _State(gram, Rows.of(rows), rtol, width, lam_cap, lam_hi, lam_lo, out, prove, ceilings, quick, early,
                tuning_module.TUNING, dip if dip is not None and 0 < dip < 1 else None,
                held=torch.zeros(0, dtype=torch.int64, device=gram.device))
    todo = torch.arange(c, device=gram.device)
    if prove or not dependent_first:  # (else exact ranks for every matrix, and the exact stages first)
        todo = _certify_and_prove(st, todo, floor, reach, dependent_first)
        if todo.numel() and k > 1 and lam_bounds is None:
            todo = _tighten(st, todo)
    if st.held.numel():
        todo = torch.cat([todo, st.held]).sort().values
    if todo.numel():
        exact_stage(st.part(gram, todo), todo, rows, st.part(lam_hi, todo), rtol, width, out)
    if prove and exact_dependent and st.proven:
        # exact ranks for the histogram, for the first ``exact_dependent`` dependent matrices in order
        # (those of ``exact_first`` have them already): eigenvalues (SVD inside the error band)
        order = (out.rank != k).nonzero().flatten()[:exact_dependent]
        exact = order[out.rank[order] == -1]
        if exact.numel():
            exact_stage(gram[exact], exact, rows, lam_hi[exact], rtol, width, out)
    if not defer_counts:
        read_counts(out)
    return out


# ----------------------------------------------------------------------------- batches of matrices


def chunk_size(k: int, d: int, budget_bytes: int | None = None) -> int:
    """How many k x k (plus k x d for the fallback) float64 matrices fit in the memory budget
    (``Tuning.context_bytes`` unless given)."""
    budget = tuning_module.TUNING.context_bytes if budget_bytes is None else budget_bytes
    return max(1, budget // (8 * (3 * k * k + k * d)))


def matrix_decisions(mats: torch.Tensor, rtol: float) -> Decisions:
    """Decide a batch of (k, d) matrices, k <= d (e.g. contexts for Assumption 2): (B, k, d)."""
    b, k, d = mats.shape
    step = chunk_size(k, d)
    parts = []
    for start in range(0, b, step):
        x = mats[start : start + step].to(torch.float64)  # (c, k, d)
        gram = x @ x.transpose(1, 2)  # (c, k, k)
        parts.append(decide(gram, lambda pos, x=x: x[pos], rtol, d))
    stages = {key: sum(p.stages[key] for p in parts) for key in parts[0].stages}
    return Decisions(torch.cat([p.rank for p in parts]), torch.cat([p.margin for p in parts]), stages,
                     bound=torch.cat([p.bound for p in parts]))
