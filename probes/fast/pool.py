"""The pool side of the k-subset tests: gathers each subset's Gram block from the pool Gram, and the
stages that read the pool rather than one block: stage 0 (float32 certificates) and stage 0b
(dependence from a subset's leading rows).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from probes.fast import tuning
from probes.fast.errors import (
    F32_MAX_K,
    F64_EPS,
    capped,
    dependence_slack,
    float32_lam_hi,
    float32_shift,
    floor_target,
)
from probes.fast.kernels import Rows, quick_dependent, rows_times, shifted_cholesky


class Pool:
    """The pool side of :func:`subset_decisions`: gathers each subset's Gram block and runs stage 0.

    On the CPU with a pool Gram, blocks are copied by ``numpy.take`` with one linear index per chunk
    into per-thread buffers that are reused from chunk to chunk."""

    def __init__(self, vectors64: torch.Tensor, pool_gram: torch.Tensor | None, k: int, rtol: float,
                 lam_cap: float | None, step: int):
        """``vectors64`` (N, d) float64 pool, ``pool_gram`` (N, N) its Gram or None (blocks by bmm),
        ``lam_cap`` sigma_1^2 of the pool or None, ``step`` the most subsets of a chunk."""
        self.x = vectors64
        self.gram = pool_gram
        self.k, self.d, self.n = k, vectors64.shape[1], vectors64.shape[0]
        self.rtol, self.lam_cap, self.step = rtol, lam_cap, step
        self.numpy = pool_gram is not None and pool_gram.device.type == "cpu"
        if self.numpy:
            self.g64 = pool_gram.contiguous().numpy()
            self.diag64 = np.ascontiguousarray(np.diagonal(self.g64))
        self.can32 = self.numpy and 2 <= k <= F32_MAX_K
        self._g32 = None
        self._lock = threading.Lock()
        self._local = threading.local()

    # -------------------------------------------------------------- buffers and gathers (CPU)
    def _buffers(self):
        buf = getattr(self._local, "buf", None)
        if buf is None:
            size = self.step * self.k * self.k  # flat: any (c, m, m) with c <= step, m <= k fits
            buf = self._local.buf = {
                "lin": np.empty(size, dtype=np.int64), "rowoff": np.empty(self.step * self.k, dtype=np.int64),
                "b64": np.empty(size, dtype=np.float64), "b32": np.empty(size, dtype=np.float32),
                "l32": torch.empty((self.step, self.k, self.k), dtype=torch.float32),
                "info": torch.empty(self.step, dtype=torch.int32),
            }
        return buf

    def _take(self, source: np.ndarray, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
        """(c, m, m) blocks source[idx[i]][:, idx[i]] of the (n, n) ``source`` for idx (c, m), into the
        flat buffer ``out``."""
        buf = self._buffers()
        idx = idx.astype(np.int64, copy=False)
        c, m = idx.shape
        rowoff = np.multiply(idx, self.n, out=buf["rowoff"][: c * m].reshape(c, m))
        lin = np.add(rowoff[:, :, None], idx[:, None, :], out=buf["lin"][: c * m * m].reshape(c, m, m))
        # indices are valid; clip is the fastest mode
        return np.take(source.reshape(-1), lin, out=out[: c * m * m].reshape(c, m, m), mode="clip")

    def rows(self, idx: torch.Tensor) -> torch.Tensor:
        """(c, m, d) float64 rows of the subsets (or leading rows) ``idx`` (c, m): one ``index_select``
        on the flattened indices (about half the time of advanced indexing with a 2-D index)."""
        c, m = idx.shape
        return self.x.index_select(0, idx.reshape(-1)).view(c, m, self.d)

    def times(self, idx: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(c, d) fl(X_S^T v) for the subsets (or leading rows) ``idx`` (c, m) and vectors v (c, m, 1).

        Where the pool is small beside m (:meth:`_whole_pool`) and each subset's rows are distinct: one
        product W^T X with the whole (N, d) pool, W (N, c) holding v at each subset's rows and exact zeros
        elsewhere, instead of a gathered (c, m, d) copy. Each entry is then the sum of its m products and
        of exact zeros (0 x = 0 and s + 0 = s are exact in IEEE arithmetic), so its rounding is bounded as
        an m-term dot product's, as :func:`probes.fast.kernels.rayleigh_up_of_product` assumes.
        Otherwise from the gathered rows."""
        c, m = idx.shape
        distinct = m < 2 or not bool((idx.sort(dim=1).values.diff(dim=1) == 0).any())
        if not self._whole_pool(m) or not distinct:
            return rows_times(self.rows(idx), v)
        w = torch.zeros(c, self.n, dtype=self.x.dtype, device=self.x.device)
        w.scatter_(1, idx, v[:, :, 0])
        return w @ self.x

    def _whole_pool(self, m: int) -> bool:
        """Whether :meth:`times` takes the product with the whole pool for subsets of m rows (it reads less
        than gathering them: N <= ``Tuning.times_pool`` m)."""
        return self.n <= tuning.TUNING.times_pool * m

    def rows_of(self, idx: torch.Tensor) -> Rows:
        """The rows of the subsets (or leading rows) ``idx`` (c, m), by position in ``idx``; their
        products from the whole pool where :meth:`times` takes it, else from gathered rows (which
        :func:`probes.fast.kernels.pivot_ceilings` then gathers a few MB at a time)."""
        take = lambda pos: self.rows(idx[pos])  # noqa: E731
        if not self._whole_pool(idx.shape[1]):
            return Rows(take)
        return Rows(take, lambda pos, v: self.times(idx[pos], v))

    def gram64(self, idx: torch.Tensor) -> torch.Tensor:
        """(c, k, k) float64 Gram blocks of the subsets ``idx`` (c, k) (a reused buffer on the CPU)."""
        if self.gram is None:
            x = self.rows(idx)  # (c, k, d)
            return x @ x.transpose(1, 2)
        if not self.numpy:
            return self.gram[idx[:, :, None], idx[:, None, :]]
        return torch.from_numpy(self._take(self.g64, idx.numpy(), self._buffers()["b64"]))

    def _pool32(self) -> tuple[np.ndarray, float]:
        with self._lock:
            if self._g32 is None:
                top = float(self.diag64.max()) if self.diag64.size else 0.0
                e = math.frexp(top)[1] if top > 0 else 0
                scale = math.ldexp(1.0, -e)  # exact power of two: largest diagonal in [1/2, 1)
                g32 = torch.empty(self.gram.shape, dtype=torch.float32)
                torch.mul(self.gram, scale, out=g32)  # exact scaling, one rounding to float32
                self._g32 = (g32.numpy(), scale)
            return self._g32

    # -------------------------------------------------------------- stage 0
    def certify32(self, idx: torch.Tensor, floor: float, *, detail: bool = False):
        """(c,) bool: lambda_min(G) > T = rtol^2 lam_hi32 10^(2 floor), proven in float32
        (:mod:`probes.fast.errors`); a success certifies full rank with margin >= floor. ``detail``: also
        return the factorisations' ``info`` (c,) and (c,) upper bounds on the float64 Gershgorin bound
        that :func:`probes.fast.errors.lam_hi_bound` computes from the same block (for
        :meth:`dependent_lead`)."""
        k, d = self.k, self.d
        g32, scale = self._pool32()
        buf = self._buffers()
        idx_np = idx.numpy()
        c = idx_np.shape[0]
        block = torch.from_numpy(self._take(g32, idx_np, buf["b32"]))  # (c, k, k) float32
        trace = torch.from_numpy(self.diag64[idx_np].sum(1)) * (1 + 2 * (k + d) * F64_EPS)  # >= trace(G)
        gersh = block.abs().sum(-1).amax(-1).to(torch.float64) / scale  # float32 row sums, unscaled
        lam_hi, gersh_up = float32_lam_hi(trace, gersh, self.lam_cap, k, d)
        target = floor_target(self.rtol**2 * lam_hi, floor)
        shift = float32_shift(target, trace, k, d, scale)
        block.diagonal(dim1=-2, dim2=-1).sub_((shift * scale).to(torch.float32)[:, None])
        lbuf = buf["l32"][:c]
        _, info = torch.linalg.cholesky_ex(block, out=(lbuf.transpose(1, 2), buf["info"][:c]))
        ok = (info == 0) & (target > 0) & (target < lam_hi) & torch.isfinite(shift)
        if not detail:
            return ok
        # the float64 row sums of the same entries are at most (1 + 2 k eps) times their exact sums
        return ok, info.clone(), gersh_up * (1 + 2 * k * F64_EPS)

    def dependent_lead(self, idx: torch.Tensor, size: int, gersh_up: torch.Tensor | None = None,
                       ceilings: bool = False, dip: float | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Stage 0b: dependence proven from the leading rows only. Returns (c,) bool: the subsets
        ``idx`` (c, k) proven dependent exactly as stage 1b would prove them, (c,) the failing pivot
        (1-based, 0 where the factorisation succeeded), and (c,) proven ceilings on sigma_k / sigma_1
        of those proven (1 elsewhere; with ``ceilings``, else all 1).

        A dependent subset's Cholesky factorisation fails at the first row that depends on the rows
        before it; when that row lies among the first ``size`` rows (known from a float32
        factorisation of the subset, or from the subsets decided before), the float64 Gram block of
        those rows alone is gathered, factorised with a shift below the stage 1b shift, and the stage
        1b shortcut (:func:`quick_dependent`) runs on it with every bound taken from the whole subset:
        k, its trace and largest diagonal entry (from the pool's diagonal) and an upper bound on the
        lam_hi stage 1b computes (the trace, the pool's cap and, where given, ``gersh_up`` from
        :meth:`certify32`). The vector it tests is zero beyond the block, so its Rayleigh quotient on the
        block equals the one on the whole Gram matrix. What it leaves goes on to the float64 stages.

        ``dip`` (with ``ceilings``; a multiplier of rtol below 1): the block is factorised first with the
        smaller shift (dip x rtol)^2 x the largest diagonal entry, which chooses only the vector tested,
        not what proves it. Where the rows are dependent up to rounding, that factorisation fails at
        the row that depends on the rows before it, not at an earlier row that is merely nearly
        dependent at rtol, and the vector it exposes is their null vector: a ceiling far below dip x
        rtol, which spares the robustness grid's lowest point a factorisation per subset. Where that
        factorisation fails but its vector proves nothing, the block is factorised again at the usual
        shift; where it succeeds (the leading rows are full rank at dip x rtol), the subset goes on to
        the float64 stages, which prove it as stage 0b would have (one factorisation more: the
        planner gives the dip up where that happens more often than it pays, ``Tuning.dip_pays``)."""
        k, d = self.k, self.d
        idx_np = idx.numpy()
        diag = torch.from_numpy(self.diag64[idx_np])  # (c, k): the blocks' diagonals, as gathered
        trace = diag.sum(-1) * (1 + 2 * k * F64_EPS)  # >= the trace as any summation order computes it
        dmax = diag.amax(-1)
        # >= the lam_hi stage 1b computes (same cap)
        lam_hi = capped(trace if gersh_up is None else torch.minimum(trace, gersh_up), self.lam_cap, k)
        gamma = dependence_slack(dmax, lam_hi, d, k, trace)
        shift = self.rtol**2 * dmax * (1 - 4 * k * F64_EPS) - gamma  # <= the stage 1b shift
        if not bool((shift > 0).any()):  # (a tolerance below the Gram route's resolution: nothing to prove)
            return (torch.zeros_like(shift, dtype=torch.bool), torch.zeros(idx.shape[0], dtype=torch.int64),
                    torch.ones_like(shift))
        rows = np.ascontiguousarray(idx_np[:, :size])  # (c, size)
        lead = torch.from_numpy(self._take(self.g64, rows, self._buffers()["b64"]))  # (c, size, size)
        usual = shift.clamp(min=0)

        def prove(at: torch.Tensor, shifts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            # the shortcut on the blocks at ``at`` (c',), factorised at ``shifts``: (dependent, ceiling, info)
            blocks = lead if at.numel() == lead.shape[0] else lead[at]  # (c', size, size)
            chol, info = shifted_cholesky(blocks, shifts)
            dep, ceil = quick_dependent(blocks, chol, info, lam_hi[at], self.rtol, d, shift[at] > 0, ceilings,
                                        full=(trace[at], dmax[at], k),
                                        rows=self.rows_of(idx[at, :size]))
            return dep, ceil, info

        every = torch.arange(idx.shape[0])
        if not (ceilings and dip is not None):
            dep, ceil, info = prove(every, usual)
            return dep, info.to(torch.int64), ceil
        dep, ceil, info = prove(every, torch.minimum(usual, (dip * self.rtol) ** 2 * dmax))
        again = ((shift > 0) & ~dep & (info > 0)).nonzero().flatten()
        if again.numel():  # (a vector the proof did not take: the usual one)
            dep[again], ceil[again], info[again] = prove(again, usual[again])
        return dep, info.to(torch.int64), ceil

