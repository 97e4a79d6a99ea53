"""Benchmark: one certified Kruskal lower bound (probes.kruskal_lower_bound) at N = 1000, where its CPU
time goes, against the same call of another checkout in the same run.

Pools (float32, as the audit's tokens; rtol = d eps(float32), the audit's tolerance):

- ``vit``: ViT-like tokens, N = 1000 vectors of width 768 around one shared mean direction (mean 30,
  an anisotropic spread with scales from 1 down to 0.01), so that the raw coherence is near 1;
- ``cluster``: half of the vectors in a 98-dimensional subspace (the cluster pool of
  ``benchmarks/bench_probes.py`` at k = 197), the rest i.i.d. Gaussian, width 768.

Each call runs in a child process (``PYTHONPATH`` at the checkout measured: this one, or ``--baseline``,
e.g. a ``git archive`` of an earlier commit), old and new interleaved, ``--repeats`` times each; the
table gives the bound and its proof (they must agree), the CPU seconds of the call (one torch thread
unless ``--threads``: CPU time is what compares on a shared machine) and, within them, the first-order
refinement of the null-space certificates (``_refine_certificates``: float32 products on the pool's
device), the linear programs (``_certificate``: HiGHS on the CPU, whatever the device) and the rest, the
wall time, and the load average (1 minute) before each call. On a GPU node everything but the linear
programs runs on the device: their CPU seconds are then what the call costs the host (``--device cuda``
measures it there).

    python benchmarks/bench_spark.py
    git archive ae6f0f2 | tar -x -C /tmp/old && python benchmarks/bench_spark.py --baseline /tmp/old
    python benchmarks/bench_spark.py --device cuda --pools vit       # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POOLS = ("vit", "cluster")

_CHILD = r"""
import json, sys, time
import torch
pool, n, d, device, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
torch.set_num_threads(threads)
import probes.spark as spark
from probes.bounds import kruskal_lower_bound
spent = {"refine": 0.0, "lp": 0.0}
for name, key in (("_refine_certificates", "refine"), ("_certificate", "lp")):
    plain = getattr(spark, name)
    def timed(*a, _plain=plain, _key=key, **kw):
        start = time.process_time()
        try:
            return _plain(*a, **kw)
        finally:
            spent[_key] += time.process_time() - start
    setattr(spark, name, timed)
g = torch.Generator().manual_seed(0)
if pool == "vit":
    scales = torch.logspace(0, -2, d, dtype=torch.float64)
    x = (30.0 * torch.randn(1, d, generator=g, dtype=torch.float64)
         + torch.randn(n, d, generator=g, dtype=torch.float64) * scales).float()
else:
    x = torch.randn(n, d, generator=g)
    x[: n // 2] = torch.randn(n // 2, 98, generator=g) @ torch.randn(98, d, generator=g)
x = x.to(device)
rtol = d * torch.finfo(torch.float32).eps
with open("/proc/loadavg") as fh:
    load = fh.read().split()[0]
cpu, wall = time.process_time(), time.perf_counter()
res = kruskal_lower_bound(x, rtol=rtol)
if x.is_cuda:
    torch.cuda.synchronize()
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"lower": res.lower, "method": res.method, "nullspace_k": res.nullspace_k,
                  "whitened": max(res.whitened_coherence_k, res.whitened_babel_k),
                  "programs": res.nullspace_programs, "cpu": cpu, "wall": wall, "load": load, **spent}))
"""


def call(tree: Path, pool: str, args: argparse.Namespace) -> dict:
    """One kruskal_lower_bound call of the checkout ``tree`` in a child process."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(args.threads))
    done = subprocess.run([sys.executable, "-c", _CHILD, pool, str(args.n), str(args.d), args.device,
                           str(args.threads)], env=env, capture_output=True, text=True, cwd=str(tree))
    if done.returncode != 0:
        raise SystemExit(f"the call of {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", default=",".join(POOLS), help="comma list of: " + ", ".join(POOLS))
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout (its root folder) to time in the same run, e.g. an earlier "
                             "commit's git archive")
    parser.add_argument("--repeats", type=int, default=2, help="calls per pool and checkout (interleaved)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--d", type=int, default=768)
    args = parser.parse_args()
    pools = [p.strip() for p in args.pools.split(",") if p.strip()]
    bad = sorted(set(pools) - set(POOLS))
    if bad:
        parser.error(f"unknown pool(s) {bad}; valid: {', '.join(POOLS)}")
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be at least 1")
    if args.baseline is not None and not (args.baseline / "probes" / "spark.py").is_file():
        parser.error(f"--baseline {args.baseline} holds no probes/spark.py; give a checkout's root folder")
    trees = [("this", ROOT)] + ([("baseline", args.baseline)] if args.baseline is not None else [])
    print(f"# kruskal_lower_bound at N = {args.n}, d = {args.d}, rtol = d eps(float32), device "
          f"{args.device}, {args.threads} torch thread(s), {time.strftime('%Y-%m-%d %H:%M')}")
    print("| pool | checkout | lower (proof) | null-space k | whitened k | LPs | CPU s | refinement s "
          "| LPs s | rest s | wall s | load |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    best: dict[tuple[str, str], list[dict]] = {}
    for pool in pools:
        for _ in range(args.repeats):
            for name, tree in reversed(trees):  # the baseline first in each round
                r = call(tree, pool, args)
                best.setdefault((pool, name), []).append(r)
                rest = r["cpu"] - r["refine"] - r["lp"]
                print(f"| {pool} | {name} | {r['lower']} ({r['method']}) | {r['nullspace_k']} "
                      f"| {r['whitened']} | {r['programs']} | {r['cpu']:.2f} | {r['refine']:.2f} "
                      f"| {r['lp']:.2f} | {rest:.2f} | {r['wall']:.2f} | {r['load']} |", flush=True)
    print("\n| pool | checkout | median CPU s | median refinement s | median LPs s | median rest s "
          "| CPU / baseline's | same bound |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for pool in pools:
        base = best.get((pool, "baseline"))
        for name, _ in trees:
            rows = best[(pool, name)]
            med = {key: statistics.median(r[key] for r in rows) for key in ("cpu", "refine", "lp")}
            ratio = same = "-"
            if base is not None:
                ratio = f"{med['cpu'] / statistics.median(r['cpu'] for r in base):.2f}"
                same = str(all((r["lower"], r["method"]) == (base[0]["lower"], base[0]["method"])
                               for r in rows))
            print(f"| {pool} | {name} | {med['cpu']:.2f} | {med['refine']:.2f} | {med['lp']:.2f} "
                  f"| {med['cpu'] - med['refine'] - med['lp']:.2f} | {ratio} | {same} |")


if __name__ == "__main__":
    main()
