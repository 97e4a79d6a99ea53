"""Profile: where one Kruskal test spends its time, and what would stall a GPU (issue 44).

For one ``probes.kruskal_test`` at a benchmark shape it prints

- the chunks of subsets, the aten ops dispatched (each a kernel launch on a GPU; counted with a
  ``TorchDispatchMode`` in the calling thread, so run with one torch thread for a full count), and the
  host reads: ops whose result the host must wait for (``.item()``, ``bool``/``int``/``float`` of a
  tensor, ``nonzero``, ``unique``, boolean indexing) and ``.tolist()`` / ``.cpu()`` calls (on the CPU
  route some of these read host tensors: an upper bound there),
  in all and per chunk, with the source lines that read most;
- with ``--profile``, torch.profiler's table of the ops that took the most time (self time; on a GPU also
  the kernels' device time).

``--route gpu`` runs on the CPU the route the fast path takes off the CPU: pool blocks gathered by
torch indexing (no NumPy buffers, no float32 stage), torch's eigenvalues, batched products where the
CPU loops over matrices (``Tuning.ceiling_loop_k``), the stage 1b shortcut's vectors batched, and chunks
of ``Tuning.device_bytes``; ``--route gpu-small`` the same with the CPU's chunks
(``Tuning.cache_bytes``: what the fast path did off the CPU before issue 44). On a CUDA device the route
is the real one and the counts are those of the device.

    OMP_NUM_THREADS=1 python benchmarks/profile_probes.py --route gpu --pools gaussian,cluster
    OMP_NUM_THREADS=1 python benchmarks/profile_probes.py --route cpu --profile
    python benchmarks/profile_probes.py --device cuda --profile        # on a GPU machine
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
import time
import traceback

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `audit` and `import probes` do

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import probes  # noqa: E402
from probes.fast import pool as pool_module  # noqa: E402
from probes.fast import subsets as subsets_module  # noqa: E402
from probes.fast import tuning  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_probes import load, make_pool  # noqa: E402  (the same pools as the benchmark)

SHAPES = {"vit": (2000, 768, 197), "bert": (2000, 1024, 512), "gpt2": (2000, 1280, 1024),
          "small": (400, 64, 32)}
READ_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
            "unique_consecutive", "is_nonzero", "equal", "repeat_interleave"}


def where() -> str:
    """The innermost frame of the probes package that led here, as path:line."""
    frames = [f for f in traceback.extract_stack() if f"{os.sep}probes{os.sep}" in f.filename]
    if not frames:
        return "(outside probes)"
    f = frames[-1]
    return f"{f.filename.split(os.sep + 'probes' + os.sep)[-1]}:{f.lineno}"


class Counter(TorchDispatchMode):
    """aten ops dispatched, and those that read a device value on the host, by kind and by source line."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.reads: collections.Counter[str] = collections.Counter()
        self.lines: collections.Counter[str] = collections.Counter()

    def read(self, kind: str) -> None:
        self.reads[kind] += 1
        self.lines[f"{where()} {kind}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops += 1
        if name in ("index", "index_put", "index_put_") and any(
                i is not None and i.dtype == torch.bool for i in args[1]):
            self.read(name + "[bool]")
        elif name in READ_OPS:
            self.read(name)
        return func(*args, **(kwargs or {}))


def gpu_route(small_chunks: bool) -> None:
    """The fast path's route off the CPU, on the CPU (see the module docstring)."""
    init = pool_module.Pool.__init__

    def device_like(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.numpy, self.can32 = False, False

    pool_module.Pool.__init__ = device_like
    t = tuning.TUNING
    changes = {"eigen_numpy": False, "ceiling_loop_k": 2**31}  # (no matrix-by-matrix loops: CPU only)
    if hasattr(t, "batched_pivots"):
        changes["batched_pivots"] = True
    if not small_chunks and hasattr(t, "device_bytes"):
        changes.update(cache_bytes=t.device_bytes, max_chunk=t.device_max_chunk)
    tuning.TUNING = dataclasses.replace(t, **changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="vit", choices=sorted(SHAPES))
    parser.add_argument("--pools", default="gaussian,cluster")
    parser.add_argument("--subsets", type=int, default=5000)
    parser.add_argument("--route", default="cpu", choices=["cpu", "gpu", "gpu-small"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--robustness", action="store_true", help="the default call (tolerance fields)")
    parser.add_argument("--profile", action="store_true", help="also torch.profiler's table of the top ops")
    parser.add_argument("--lines", type=int, default=12, help="source lines that read most, shown")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    pools = [p.strip() for p in args.pools.split(",") if p.strip()]
    bad = sorted(set(pools) - {"gaussian", "cluster"})
    if bad:
        parser.error(f"unknown pool(s) {bad}; valid: gaussian, cluster")
    if args.device != "cpu" and args.route != "cpu":
        parser.error("--route gpu emulates the device route on the CPU; on a device use --route cpu")
    if args.route != "cpu":
        gpu_route(args.route == "gpu-small")
    mode: list[Counter] = []
    for name in ("tolist", "cpu"):  # (.numpy() only works on the CPU: not a device read)
        plain = getattr(torch.Tensor, name)

        def counted(self, *a, _plain=plain, _name=name, **kw):
            if mode and (_name != "cpu" or self.device.type != "cpu"):
                mode[0].read(_name)
            return _plain(self, *a, **kw)

        setattr(torch.Tensor, name, counted)
    chunks = collections.Counter()
    decide_chunk = subsets_module.decide_chunk

    def counted_chunk(*a, **kw):
        chunks["chunks"] += 1
        return decide_chunk(*a, **kw)

    subsets_module.decide_chunk = counted_chunk
    n, d, k = SHAPES[args.shape]
    print(f"# one kruskal_test: shape {args.shape} (N={n}, d={d}, k={k}), {args.subsets} subsets, route "
          f"{args.route}, device {args.device}, torch threads {torch.get_num_threads()}, robustness "
          f"{args.robustness}, load {load()}, torch {torch.__version__}")
    print("| pool | chunks | subsets per chunk | aten ops (launches) | ops per chunk | host reads "
          "| reads per chunk | reads by kind | wall s | full-rank fraction | stages |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|")
    details = []
    for kind in pools:
        x = make_pool(kind, n, d, k, args.seed).to(args.device)
        probes.kruskal_test(x, k, subsets=50, robustness=False, progress=False)  # warm-up (one-off costs)
        chunks.clear()
        counter = Counter()
        mode[:] = [counter]
        start = time.perf_counter()
        with counter:
            res = probes.kruskal_test(x, k, subsets=args.subsets, robustness=args.robustness, progress=False)
            if x.is_cuda:
                torch.cuda.synchronize()
        wall = time.perf_counter() - start
        mode[:] = []
        c = max(1, chunks["chunks"])
        reads = sum(counter.reads.values())
        kinds = ", ".join(f"{key} {value}" for key, value in counter.reads.most_common())
        stages = ", ".join(f"{key} {value}" for key, value in res.stages.items() if value)
        print(f"| {kind} | {chunks['chunks']} | {args.subsets / c:.0f} | {counter.ops} "
              f"| {counter.ops / c:.0f} | {reads} | {reads / c:.1f} | {kinds} | {wall:.2f} "
              f"| {res.fraction:.4f} | {stages} |", flush=True)
        details.append((kind, counter))
        if args.profile:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if x.is_cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=activities) as prof:
                probes.kruskal_test(x, k, subsets=args.subsets, robustness=args.robustness, progress=False)
                if x.is_cuda:
                    torch.cuda.synchronize()
            key = "self_cuda_time_total" if x.is_cuda else "self_cpu_time_total"
            details.append((kind + " profile", prof.key_averages().table(sort_by=key, row_limit=15)))
    for kind, item in details:
        if isinstance(item, Counter):
            print(f"\n# {kind}: the source lines that read most")
            for line, count in item.lines.most_common(args.lines):
                print(f"    {count:6d}  {line}")
        else:
            print(f"\n# {kind} (torch.profiler, top ops by self time)\n{item}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
