"""CP-rank estimates: the least rank whose best fit (over restarts) reaches a stated relative error.

"Rank r fits" means some rank-r CP tensor T_hat found by alternating least squares has
``||T - T_hat||_F / ||T||_F <= tolerance``. The estimate is the least fitting rank between

* a floor that no rank below can beat: a rank-r CP tensor has every flattening of rank <= r, so its
  error is at least the flattening's tail singular-value energy (Eckart-Young); and
* a ceiling: for a database the certified upper bound of :mod:`auditor.lab.facts.tensor` (an exact
  decomposition of that size exists, so it is never fitted), otherwise the trivial slice bound.

Fitting assumes that "r fits" is monotone in r (true for the best approximation; ALS can miss it, which
restarts make unlikely, and every tried rank's best error is returned so it can be inspected). The
tolerance matters: ranks whose best approximations only converge to T (border rank below rank, e.g.
the W tensor e1e1e2 + e1e2e1 + e2e1e1, rank 3, border rank 2) fit at any loose tolerance. For a 0/1
tensor with ||T||_F = sqrt(N), ``tolerance < 0.5 / sqrt(N)`` makes every entry of T_hat round to T.

Two backends:

* ``tensorly``: :func:`tensorly.decomposition.parafac` on the dense tensor, one restart at a time
  (the reference implementation; used for tensors up to ``dense_limit`` entries under ``auto``).
* ``als``: a batched ALS on the non-zeros (coordinate format). Every (rank, restart) pair is a member
  of one batch (ranks padded to the largest with a component mask); the MTTKRP costs
  ``members x nnz x rank`` instead of ``members x size x rank``, which is what makes databases of
  tens of thousands of triples fit on a laptop CPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from auditor.core.errors import AuditError, did_you_mean
from auditor.lab.facts.database import FactDatabase
from auditor.lab.facts.tensor import compress, dense_tensor, flattening, rank_bounds

log = logging.getLogger(__name__)

STALL = 200  # sweeps over which a member must lower its error by 0.01% to keep going
BACKENDS = ("auto", "tensorly", "als")


@dataclass(frozen=True)
class CPConfig:
    """How a CP rank is estimated."""

    tolerance: float = 1e-4  # relative Frobenius error at which a rank "fits" (CLI --cp-tolerance)
    restarts: int = 4  # random initialisations per rank (the best one counts)
    max_iter: int = 3000  # ALS sweeps per fit
    backend: str = "auto"  # "auto" | "tensorly" | "als"
    dense_limit: int = 20_000  # auto: tensorly up to this many entries, batched ALS above
    batch_ranks: int = 6  # als: ranks fitted together per search round
    compress: bool = True  # databases: fit the core without zero/repeated slices (same CP rank)
    verify_ceiling: bool = False  # also fit at a certified ceiling that no lower rank beat (checks ALS)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.tolerance < 1:
            raise AuditError(f"cp_tolerance (the CP fit error) must be in (0, 1), got {self.tolerance}")
        if self.restarts < 1 or self.max_iter < 1 or self.batch_ranks < 1:
            raise AuditError("restarts, max_iter and batch_ranks must be >= 1")
        if self.backend not in BACKENDS:
            raise did_you_mean("CP backend", self.backend, BACKENDS)


@dataclass
class CPRankEstimate:
    """The estimate and how it was reached."""

    rank: int  # least rank that fits at tolerance (or the certified ceiling when none below it does)
    floor: int  # Eckart-Young: no rank below this can reach tolerance
    ceiling: int  # largest rank considered (certified for databases)
    ceiling_certified: bool  # an exact decomposition with `ceiling` terms is known
    reached_by: (
        str  # "fit" (a restart reached tolerance), "bounds" (floor = certified ceiling), "ceiling", "none"
    )
    tolerance: float
    backend: str
    shape: tuple[int, int, int]  # the tensor that was fitted (the compressed core for databases)
    seconds: float
    errors: dict[int, float] = field(default_factory=dict)  # best relative error per tried rank

    def to_row(self) -> dict[str, Any]:
        row = {k: v for k, v in asdict(self).items() if k != "errors"}
        row["shape"] = "x".join(str(s) for s in self.shape)
        row["tried"] = ";".join(f"{r}:{e:.3g}" for r, e in sorted(self.errors.items()))
        return row


def eckart_young_floor(tensor: np.ndarray, tolerance: float, max_side: int = 4096) -> int:
    """Least r such that every flattening's best rank-r matrix error is <= tolerance * ||T|| (a rank floor).

    Flattenings whose shorter side exceeds ``max_side`` are skipped (the floor stays valid, only weaker).
    """
    t = np.asarray(tensor, dtype=np.float64)
    norm2 = float(np.sum(t * t))
    if norm2 == 0:
        return 0
    floor = 0
    for mode in range(3):
        flat = flattening(t, mode)  # (I_mode, rest)
        small = flat if flat.shape[0] <= flat.shape[1] else flat.T
        if small.shape[0] > max_side:
            continue
        eig = np.linalg.svd(small, compute_uv=False) ** 2  # sigma^2, descending (no Gram: keeps precision)
        tail = np.concatenate([np.cumsum(eig[::-1])[::-1], [0.0]])  # tail[r] = sum_{i >= r} sigma_i^2
        ok = np.flatnonzero(tail <= (tolerance**2) * norm2 * (1 + 1e-9))
        floor = max(floor, int(ok[0]))
    return floor


def estimate_cp_rank(
    tensor: np.ndarray | FactDatabase,
    config: CPConfig = CPConfig(),
    *,
    floor: int | None = None,
    ceiling: int | None = None,
    ceiling_certified: bool = False,
    progress: bool = False,
) -> CPRankEstimate:
    """Estimate the CP rank of a 3-way tensor or of a database's tensor D.

    Args:
        tensor: a dense (I, J, K) array or a :class:`FactDatabase`.
        config: tolerance, restarts, backend.
        floor, ceiling: override the search interval; a ceiling given here is fitted like any other rank
            unless ``ceiling_certified`` says that a decomposition of that size is known.
    """
    t0 = time.perf_counter()
    if isinstance(tensor, FactDatabase):
        dense = dense_tensor(tensor)
        if config.compress:
            dense = compress(dense).astype(np.float64)
        top = rank_bounds(tensor).upper
    else:
        dense = np.asarray(tensor, dtype=np.float64)
        if dense.ndim != 3:
            raise AuditError(f"a CP rank needs a 3-way tensor, got shape {dense.shape}")
        n1, n2, n3 = dense.shape
        top = min(n1 * min(n2, n3), n2 * min(n1, n3), n3 * min(n1, n2))  # sum of slice ranks
    certified = ceiling is None or ceiling_certified
    top = top if ceiling is None else ceiling
    bottom = min(eckart_young_floor(dense, config.tolerance) if floor is None else floor, top)
    backend = config.backend
    if backend == "auto":
        backend = "tensorly" if dense.size <= config.dense_limit else "als"
    errors: dict[int, float] = {}

    def fits(ranks: Sequence[int]) -> dict[int, bool]:
        new = [r for r in ranks if r not in errors]
        if backend == "tensorly":
            for r in new:
                errors[r] = _tensorly_best_error(dense, r, config)
        elif new:
            errors.update(als_best_errors(dense, new, config, progress=progress))
        return {r: errors[r] <= config.tolerance for r in ranks}

    # invariant: ranks below lo do not fit; hi fits when hi_fits (always for a certified ceiling)
    lo, hi, hi_fits = max(bottom, 1 if np.any(dense) else 0), top, certified
    width = config.batch_ranks if backend == "als" else 1
    found, rounds = False, 0  # gallop up from the floor until a rank fits, then narrow down
    while (last := hi - 1 if hi_fits else hi) >= lo:
        probe = _spread(lo, last, width) if found else _gallop(lo, last, width, rounds)
        rounds += 1
        result = fits(probe)
        passing = [r for r in probe if result[r]]
        if passing:
            hi, hi_fits, found = min(passing), True, True
        failing = [r for r in probe if not result[r] and r <= last]
        if failing:
            lo = max(failing) + 1
    if config.verify_ceiling and certified and hi == top and top > 0:
        fits([top])
    rank = hi
    if errors.get(rank, np.inf) <= config.tolerance:
        reached = "fit"
    else:  # floor == certified ceiling: no rank below fits at tolerance and the ceiling is exact
        reached = "bounds" if certified and bottom == top else ("ceiling" if certified else "none")
    return CPRankEstimate(
        rank=int(rank),
        floor=int(bottom),
        ceiling=int(top),
        ceiling_certified=certified,
        reached_by=reached,
        tolerance=config.tolerance,
        backend=backend,
        shape=tuple(int(s) for s in dense.shape),
        seconds=time.perf_counter() - t0,
        errors={int(r): float(e) for r, e in errors.items()},
    )


def _spread(lo: int, hi: int, count: int) -> list[int]:
    """Up to ``count`` distinct integers spread evenly over [lo, hi], always including lo."""
    if hi <= lo:
        return [lo]
    if count == 1:
        return [(lo + hi) // 2]
    return sorted({int(round(x)) for x in np.linspace(lo, hi, min(count, hi - lo + 1))})


def _gallop(lo: int, hi: int, count: int, round_: int) -> list[int]:
    """Probes above the last failure: consecutive ranks first, then strides that double every round."""
    offsets = [2**round_ - 1] if count == 1 else [j * 2**round_ for j in range(count)]
    return sorted({min(lo + o, hi) for o in offsets})


def _tensorly_best_error(dense: np.ndarray, rank: int, config: CPConfig) -> float:
    """Best relative error over restarts of tensorly's parafac at ``rank`` (stops at the first hit)."""
    from tensorly.decomposition import parafac

    best = np.inf
    for restart in range(config.restarts):
        seen: list[float] = []

        def stop(_cp: Any, error: float, seen: list[float] = seen) -> bool:
            seen.append(float(error))
            return float(error) <= config.tolerance

        try:
            parafac(
                dense,
                rank,
                n_iter_max=config.max_iter,
                init="svd" if restart == 0 and rank <= min(dense.shape) else "random",
                random_state=_member_seed(config.seed, rank, restart),
                tol=1e-12,
                linesearch=True,
                callback=stop,
            )
        except np.linalg.LinAlgError:  # a degenerate start (collapsed components): count what it reached
            log.debug("parafac rank %d restart %d hit a singular system", rank, restart)
        best = min(best, min(seen) if seen else np.inf)
        if best <= config.tolerance:
            break
    return float(best)


def _member_seed(seed: int, rank: int, restart: int) -> int:
    return int(np.random.SeedSequence([seed, rank, restart]).generate_state(1)[0])


def als_best_errors(
    dense: np.ndarray, ranks: Sequence[int], config: CPConfig, *, progress: bool = False
) -> dict[int, float]:
    """Best relative error over ``config.restarts`` restarts for each rank, by batched sparse ALS."""
    coords = np.argwhere(dense != 0)  # (nnz, 3)
    values = dense[tuple(coords.T)]  # (nnz,)
    members = [(r, s) for r in ranks for s in range(config.restarts)]
    svd = _leading_singular_vectors(dense, max(ranks))
    errors = batched_cp_als(coords, values, dense.shape, members, config, svd_init=svd, progress=progress)
    best: dict[int, float] = {}
    for (r, _), e in zip(members, errors):
        best[r] = min(best.get(r, np.inf), float(e))
    return best


def batched_cp_als(
    coords: np.ndarray,
    values: np.ndarray,
    shape: tuple[int, int, int],
    members: Sequence[tuple[int, int]],
    config: CPConfig,
    *,
    budget: int = 30_000_000,
    svd_init: list[np.ndarray] | None = None,
    progress: bool = False,
) -> np.ndarray:
    """Fit every (rank, restart) member to the sparse tensor; return each one's final relative error.

    Args:
        coords: (nnz, 3) int coordinates of the non-zeros; values: (nnz,) their values.
        shape: (I, J, K) of the tensor.
        members: (rank, restart) pairs; a member's start depends only on (config.seed, rank, restart):
            restart 0 starts from ``svd_init`` when given and rank <= every dimension (per mode, the
            leading left singular vectors of the flattening), the others from uniform noise.
        budget: members x nnz x max-rank floats held at once; larger batches run in chunks.
    Members stop at ``config.tolerance``, when a member of lower or equal rank has reached it, or when their
    error stalls (less than 0.01% drop over 200 sweeps).
    """
    idx = torch.as_tensor(np.asarray(coords), dtype=torch.long)  # (nnz, 3)
    val = torch.as_tensor(np.asarray(values), dtype=torch.float64)  # (nnz,)
    R = max(r for r, _ in members)
    chunk = max(1, budget // max(1, idx.shape[0] * R))
    out = np.empty(len(members))
    bar = tqdm(total=len(members), desc="cp-als", disable=not progress, leave=False)
    for start in range(0, len(members), chunk):
        part = members[start : start + chunk]
        out[start : start + len(part)] = _als_chunk(idx, val, shape, part, config, svd_init)
        bar.update(len(part))
    bar.close()
    return out


def _als_chunk(
    idx: torch.Tensor,
    val: torch.Tensor,
    shape: tuple[int, int, int],
    members: Sequence[tuple[int, int]],
    config: CPConfig,
    svd_init: list[np.ndarray] | None,
) -> np.ndarray:
    M, R = len(members), max(r for r, _ in members)
    mask = torch.zeros(M, R, dtype=torch.bool)  # (M, R) live components
    ranks = torch.tensor([r for r, _ in members])  # (M,)
    factors = [torch.zeros(M, n, R, dtype=torch.float64) for n in shape]  # 3 x (M, I_mode, R)
    for m, (rank, restart) in enumerate(members):
        mask[m, :rank] = True
        g = torch.Generator().manual_seed(_member_seed(config.seed, rank, restart))
        for mode, (f, n) in enumerate(zip(factors, shape)):
            f[m, :, :rank] = torch.rand(n, rank, generator=g, dtype=torch.float64)
            if restart == 0 and svd_init is not None and rank <= min(shape):
                u = torch.as_tensor(svd_init[mode][:, :rank])  # (I_mode, <= rank)
                f[m, :, : u.shape[1]] = u
    norm2 = float((val * val).sum())
    eye = torch.eye(R, dtype=torch.float64)
    pad = torch.diag_embed((~mask).double())  # (M, R, R) identity on padded components
    active = torch.ones(M, dtype=torch.bool)
    err = torch.full((M,), np.inf, dtype=torch.float64)
    accel = torch.full((M,), 2.0, dtype=torch.float64)  # extrapolation exponent per member
    history: list[torch.Tensor] = []
    for sweep in range(config.max_iter):
        live = active.nonzero().squeeze(1)  # (M_live,) members still fitting
        old = [f[live] for f in factors]  # 3 x (M_live, I_mode, R)
        f_live = [f.clone() for f in old]
        m_live, pad_live = mask[live], pad[live]
        for mode in range(3):
            a, b = [x for x in range(3) if x != mode]
            fa, fb = f_live[a], f_live[b]
            prod = fa[:, idx[:, a]] * fb[:, idx[:, b]] * val[None, :, None]  # (M_live, nnz, R)
            mttkrp = torch.zeros(len(live), shape[mode], R, dtype=torch.float64)
            mttkrp.index_add_(1, idx[:, mode], prod)  # (M_live, I_mode, R)
            gram = (fa.transpose(1, 2) @ fa) * (fb.transpose(1, 2) @ fb)  # (M_live, R, R)
            ridge = 1e-12 * gram.diagonal(dim1=1, dim2=2).sum(-1).clamp(min=1e-300)  # (M_live,)
            system = gram + pad_live + ridge[:, None, None] * eye
            f_live[mode] = (
                torch.linalg.solve(system, mttkrp.transpose(1, 2)).transpose(1, 2) * m_live[:, None, :]
            )
        # <T, T_hat> = sum(mttkrp * C) and ||T_hat||^2 = sum(gram * C^T C), from the last mode's update
        c = f_live[2]
        inner = (mttkrp * c).sum((1, 2))  # (M_live,)
        fit2 = (gram * (c.transpose(1, 2) @ c)).sum((1, 2))  # (M_live,)
        now = torch.sqrt((norm2 - 2 * inner + fit2).clamp(min=0)) / np.sqrt(norm2)  # (M_live,)
        _balance(f_live, m_live)
        if sweep > 0:  # line search: extrapolate along the last sweep's step, keep it where it helps
            jump = (sweep + 1.0) ** (1.0 / accel[live])  # (M_live,)
            ext = [o + jump[:, None, None] * (n - o) for o, n in zip(old, f_live)]
            ext_err = _relative_error(ext, idx, val, norm2)  # (M_live,)
            better = ext_err < now
            f_live = [torch.where(better[:, None, None], e, n) for e, n in zip(ext, f_live)]
            now = torch.where(better, ext_err, now)
            accel[live] = torch.where(better, accel[live], accel[live] + 1)
        err[live] = now
        for f, fl in zip(factors, f_live):
            f[live] = fl
        history.append(err.clone())
        done = err <= config.tolerance
        if bool(done.any()):  # a fitting rank makes every member of that rank or above pointless
            active &= ranks < int(ranks[done].min())
        if sweep >= STALL:
            active &= (history[-STALL - 1] - err) >= 1e-4 * err  # else stalled
        if not bool(active.any()):
            break
    return err.numpy()


def _leading_singular_vectors(dense: np.ndarray, rank: int) -> list[np.ndarray]:
    """Per mode, the leading ``rank`` left singular vectors of the flattening (fewer if it is smaller)."""
    out = []
    for mode in range(3):
        flat = flattening(dense, mode)  # (I_mode, rest)
        u, _, _ = np.linalg.svd(flat, full_matrices=False)  # (I_mode, min(I_mode, rest))
        out.append(u[:, :rank])
    return out


def _relative_error(
    factors: list[torch.Tensor], idx: torch.Tensor, val: torch.Tensor, norm2: float
) -> torch.Tensor:
    """(M,) ||T - [[A, B, C]]|| / ||T|| for batched factors 3 x (M, I_mode, R) and sparse T."""
    A, B, C = factors
    at_nnz = (A[:, idx[:, 0]] * B[:, idx[:, 1]] * C[:, idx[:, 2]]).sum(-1)  # (M, nnz)
    inner = (at_nnz * val[None, :]).sum(-1)  # (M,)
    grams = [f.transpose(1, 2) @ f for f in factors]  # 3 x (M, R, R)
    fit2 = (grams[0] * grams[1] * grams[2]).sum((1, 2))  # (M,)
    return torch.sqrt((norm2 - 2 * inner + fit2).clamp(min=0)) / np.sqrt(norm2)


def _balance(factors: list[torch.Tensor], mask: torch.Tensor) -> None:
    """Give the three columns of every component the same norm (the fit is unchanged)."""
    norms = [f.norm(dim=1).clamp(min=1e-300) for f in factors]  # 3 x (M, R)
    geo = (norms[0] * norms[1] * norms[2]) ** (1 / 3)
    for f, n in zip(factors, norms):
        f.mul_(torch.where(mask, geo / n, torch.ones_like(n))[:, None, :])
