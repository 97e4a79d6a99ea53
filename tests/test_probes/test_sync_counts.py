"""Host reads of the fast path, counted on the CPU: what would stall a GPU.

On a GPU every read of a device value by the host (``.item()``, ``bool(tensor)``, ``int(tensor)``,
``.tolist()``, a boolean index, ``nonzero``, ``unique``) waits for every kernel queued before it. The
fast path keeps its stage counts and masked writes on the device and reads back a chunk's statistics
once; off the CPU a chunk holds ``Tuning.device_bytes`` of blocks, so a test runs in a few chunks. These
tests run the path a GPU takes (torch gathers from the pool Gram, no float32 stage, torch's eigvalsh, the
stage 1b vectors for every matrix at once) on the CPU, count the host reads with a dispatch mode, and
check that they do not grow with the number of subsets: not at all within one chunk, and by a fixed
number per chunk when the chunks are small.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import probes
from probes.fast import pool as pool_module
from probes.fast import subsets as subsets_module
from probes.fast import tuning

# aten ops whose result the host must wait for on a GPU (their output size or value is data-dependent)
READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
         "unique_consecutive", "is_nonzero", "equal", "repeat_interleave"}


class HostReads(TorchDispatchMode):
    """Counts the aten ops that read a device value on the host (boolean indexing included) and the
    kernels launched (every other aten op), in the thread that runs it (one torch thread here)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: collections.Counter[str] = collections.Counter()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops += 1
        if name in ("index", "index_put", "index_put_") and any(
                i is not None and i.dtype == torch.bool for i in args[1]):
            self.reads[name + "[bool]"] += 1
        elif name in READS:
            self.reads[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def gpu_route(monkeypatch):
    """The fast path as it runs off the CPU: pool blocks gathered by torch indexing (no NumPy buffers,
    no float32 stage), torch's eigenvalues, the stage 1b vectors batched; one torch thread, so that
    every op runs in the counting thread. ``.tolist()`` is counted too (it dispatches no op on the CPU,
    but copies from a GPU)."""
    init = pool_module.Pool.__init__

    def device_like(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.numpy, self.can32 = False, False

    monkeypatch.setattr(pool_module.Pool, "__init__", device_like)
    monkeypatch.setattr(tuning, "TUNING", dataclasses.replace(tuning.TUNING, eigen_numpy=False,
                                                              batched_pivots=True))
    tolists = collections.Counter()
    plain = torch.Tensor.tolist

    def counted(self):
        tolists["tolist"] += 1
        return plain(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    chunks = collections.Counter()
    decide_chunk = subsets_module.decide_chunk

    def counted_chunk(*args, **kwargs):
        chunks["chunks"] += 1
        return decide_chunk(*args, **kwargs)

    monkeypatch.setattr(subsets_module, "decide_chunk", counted_chunk)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield tolists, chunks
    finally:
        torch.set_num_threads(threads)


def make_pool(kind: str, n: int, d: int, k: int) -> torch.Tensor:
    """Float32 vectors (as the audit's tokens): ``gaussian`` i.i.d., ``cluster`` half of them in a
    (k // 2)-dimensional subspace, so that about half the k-subsets are dependent."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    if kind == "cluster":
        x[: n // 2] = torch.randn(n // 2, k // 2, generator=g) @ torch.randn(k // 2, d, generator=g)
    return x


def count(route, x: torch.Tensor, k: int, subsets: int) -> tuple[int, int, int, float]:
    """(host reads, kernels, chunks, full-rank share) of one kruskal_test."""
    tolists, chunks = route
    tolists.clear()
    chunks.clear()
    with HostReads() as mode:
        res = probes.kruskal_test(x, k, subsets=subsets, robustness=False, progress=False)
    return sum(mode.reads.values()) + tolists["tolist"], mode.ops, chunks["chunks"], res.fraction


def chunk_of(monkeypatch, subsets: int, k: int) -> None:
    """Chunks of ``subsets`` subsets at this k (the CPU's cache budget, as a device's would set it)."""
    monkeypatch.setattr(tuning, "TUNING", dataclasses.replace(tuning.TUNING, cache_bytes=8 * k * k * subsets,
                                                              max_chunk=subsets))


@pytest.mark.parametrize("kind", ["gaussian", "cluster"])
def test_host_reads_do_not_grow_with_the_subsets_in_a_chunk(gpu_route, monkeypatch, kind):
    k = 24
    x = make_pool(kind, 300, 48, k)
    chunk_of(monkeypatch, 8192, k)  # every subset beyond the pilot's in one chunk
    small = count(gpu_route, x, k, 500)
    large = count(gpu_route, x, k, 5000)
    assert small[2] == large[2] == 2  # the pilot chunk and one more
    if kind == "cluster":
        assert 0.3 < small[3] < 0.8 and 0.3 < large[3] < 0.8  # the dependence proofs did run
    # the same reads and launches for 5000 subsets as for 500 (the stage 1b shortcut's vectors no longer
    # go per distinct failing pivot, which grew with the subsets)
    assert large[0] <= small[0] + (large[2] - small[2]), (small, large)
    assert large[1] <= small[1] + 8, (small, large)


@pytest.mark.parametrize("kind", ["gaussian", "cluster"])
def test_host_reads_per_chunk_are_a_fixed_number(gpu_route, monkeypatch, kind):
    """Same chunk size, ten times the subsets: the reads grow with the chunks, by a number per chunk
    that does not depend on the subsets in it: 2 where every subset is certified (which certificates
    failed, and the chunk's statistics for the planner); where the stage 1b shortcut runs, also its
    candidates, their largest pivot, up to two refinement rounds, what it left, and stage 1b proper on
    that (measured: 10.2 a chunk on this pool, 36 chunks of 125 subsets)."""
    k = 24
    x = make_pool(kind, 300, 48, k)
    chunk_of(monkeypatch, 125, k)
    small = count(gpu_route, x, k, 500)
    large = count(gpu_route, x, k, 5000)
    per_chunk = (large[0] - small[0]) / (large[2] - small[2])
    limit = 2 if kind == "gaussian" else 12
    assert large[2] - small[2] == 36 and per_chunk <= limit, (small, large, per_chunk)


def test_the_gpu_route_decides_as_the_cpu_route(gpu_route, monkeypatch):
    """The counted route is the fast path itself: the same verdicts and ranks as the CPU's route (the
    float32 stage, NumPy gathers, per-pivot vectors)."""
    k = 24
    x = make_pool("cluster", 300, 48, k)
    device = probes.kruskal_test(x, k, subsets=1500, robustness=False, progress=False)
    monkeypatch.undo()
    cpu = probes.kruskal_test(x, k, subsets=1500, robustness=False, progress=False)
    assert device.full_rank == cpu.full_rank and device.rank_counts == cpu.rank_counts
    assert device.witness == cpu.witness


def test_chunks_off_the_cpu_hold_the_device_budget():
    t = tuning.TUNING
    k = 197
    assert subsets_module.subset_step(k, t, "cpu") == min(t.max_chunk, t.cache_bytes // (8 * k * k))
    assert subsets_module.subset_step(k, t, torch.device("cuda")) == min(t.device_max_chunk,
                                                                         t.device_bytes // (8 * k * k))
    assert subsets_module.subset_step(k, t) == subsets_module.subset_step(k, t, "cpu")


def test_batched_pivot_vectors_are_the_grouped_ones_up_to_rounding(monkeypatch):
    """The stage 1b vectors for every matrix at once (the route off the CPU) against one group per
    failing pivot (the CPU's): z = G_11^-1 g_j from the same factor, each within the forward error of two
    backward-stable triangular solves, 4 j eps cond(G_11) |z| (doubled for the refinement step)."""
    from probes.fast import kernels

    g = torch.Generator().manual_seed(3)
    t, k, d = 40, 24, 48
    x = torch.randn(t, k, d, generator=g, dtype=torch.float64)
    for i in range(t):  # the rows from a pivot on (9 .. 20) depend on the rows before it
        j = 9 + i % 12
        x[i, j:] = torch.randn(k - j, j, generator=g, dtype=torch.float64) @ x[i, :j]
    gram = x @ x.transpose(1, 2)
    shift = 1e-10 * gram.diagonal(dim1=-2, dim2=-1).amax(-1)
    chol, info = kernels.shifted_cholesky(gram, shift)
    pivot = info.to(torch.int64) - 1
    candidates = info > 0
    assert bool(candidates.all())
    vectors = {}
    for batched in (False, True):
        monkeypatch.setattr(tuning, "TUNING", dataclasses.replace(tuning.TUNING, batched_pivots=batched))
        v = kernels.pivot_vectors(gram, chol, pivot, candidates)
        kernels.refine(gram, chol, pivot, v, None)
        vectors[batched] = v[..., 0]
    eps = torch.finfo(torch.float64).eps
    for i in range(t):
        j = int(pivot[i])
        lam = torch.linalg.eigvalsh(gram[i, :j, :j] - shift[i] * torch.eye(j, dtype=torch.float64))
        cond = float(lam[-1] / lam[0])
        z = vectors[False][i]
        assert float(z[j]) == float(vectors[True][i, j]) == 1.0 and not bool(vectors[True][i, j + 1:].any())
        bound = 8 * j * eps * cond * float(z[:j].norm())
        assert float((vectors[True][i, :j] - z[:j]).norm()) <= bound, (i, j, cond)
