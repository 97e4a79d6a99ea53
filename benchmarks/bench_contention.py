"""Benchmark: the probes test and a small audit beside other work on the same cores.

On a shared node or a laptop other processes hold cores. Two OpenMP teams whose workers spin while
they wait for each other (libgomp's default) take turns at a crawl; a process that is not OpenMP does
not cause this. This script measures the cliff and the fix, each case in a fresh subprocess so the
OpenMP runtime starts with the environment under test:

- loads beside the measured job: ``none``; ``busy`` (a plain Python busy loop per core, not OpenMP);
  ``torch1`` / ``torch2`` (one or two other torch jobs, each a loop of batched Cholesky
  factorisations with torch's default threads and wait policy: what a training run or an older
  audit does);
- the measured job: ``probes.kruskal_test`` at the ViT shape (N = 2000, d = 768, k = 197,
  ``--subsets`` subsets, default call), and with ``--audit`` also ``audit vit-base`` on a few examples;
- its settings: ``before`` (torch imported before probes with no wait policy set: what the project did
  until now, and what a library user gets who sets nothing and imports torch first), ``after`` (probes
  imported first: the project sets ``OMP_WAIT_POLICY=PASSIVE`` before the OpenMP runtime starts) at
  two threads, and the one-thread time as the yardstick (target: the default never slower than the
  one-thread time x 1.5 beside other torch jobs; on a quiet machine within 5% of ``before``).

Each cell is the best of ``--repeats`` runs; the load average is printed beside every line.

    python benchmarks/bench_contention.py                        # probes test, all loads
    python benchmarks/bench_contention.py --loads none,torch1 --repeats 3
    python benchmarks/bench_contention.py --audit                # also the audit's stages
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The measured job: prints its own wall time (imports and data set-up excluded) on the last line.
PROBE_JOB = """
import os, sys, time
first = sys.argv[1]
threads = int(sys.argv[2])
subsets = int(sys.argv[3])
if first == "torch":
    import torch
    import probes
else:
    import probes
    import torch
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
x = torch.randn(2000, 768, generator=g)
probes.kruskal_test(x[:300], k=197, subsets=50, progress=False)  # warm the kernels
t0 = time.perf_counter()
r = probes.kruskal_test(x, k=197, subsets=subsets, progress=False, seed=1)
print(f"{time.perf_counter() - t0:.3f} {r.fraction}")
"""

# A competing torch job: batched Cholesky factorisations in a loop, torch defaults everywhere.
TORCH_LOAD = """
import torch
a = torch.randn(400, 128, 128, dtype=torch.float64)
spd = a @ a.transpose(-1, -2) + 128 * torch.eye(128, dtype=torch.float64)
while True:
    torch.linalg.cholesky(spd)
"""

BUSY_LOAD = "while True:\n    pass\n"


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def start_load(kind: str) -> list[subprocess.Popen]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    cores = os.cpu_count() or 1
    if kind == "none":
        return []
    if kind == "busy":
        return [subprocess.Popen([sys.executable, "-c", BUSY_LOAD], env=env) for _ in range(cores)]
    if kind.startswith("torch"):
        return [subprocess.Popen([sys.executable, "-c", TORCH_LOAD], env=env) for _ in range(int(kind[5:]))]
    raise SystemExit(f"unknown load {kind!r}; valid: none, busy, torch1, torch2")


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run_probe(setting: str, threads: int, subsets: int, timeout: float) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    first = "torch" if setting == "before" else "probes"
    try:
        out = subprocess.run([sys.executable, "-c", PROBE_JOB, first, str(threads), str(subsets)], env=env,
                             capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=True)
    except subprocess.TimeoutExpired:
        return float("inf")
    return float(out.stdout.strip().splitlines()[-1].split()[0])


def run_audit(setting: str, threads: int, timeout: float, out: Path) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if setting == "before":  # what the CLI did before it set a wait policy: libgomp's default
        env["OMP_WAIT_POLICY"] = ""
    cmd = [sys.executable, "-m", "auditor.cli", "vit-base", "--samples", "250", "--subsets", "1000",
           "--threads", str(threads), "-q", "--out", str(out), "--no-robustness"]
    t0 = time.perf_counter()
    try:
        subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=True)
    except subprocess.TimeoutExpired:
        return float("inf")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loads", default="none,busy,torch1,torch2")
    ap.add_argument("--subsets", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as inf")
    ap.add_argument("--audit", action="store_true", help="also time a small `audit vit-base`")
    args = ap.parse_args()
    print(f"# {os.cpu_count()} cores, python {sys.version.split()[0]}, load {loadavg()} at start")
    cases = [("before", 2), ("after", 2), ("after", 1)]
    print("| load beside | job | before, 2 threads | after, 2 threads | 1 thread | after / 1 thread "
          "| after / before | load |")
    print("|---|---|---|---|---|---|---|---|")
    tmp = ROOT / ".bench-contention-out"
    for kind in args.loads.split(","):
        procs = start_load(kind)
        try:
            time.sleep(2.0 if procs else 0.0)
            jobs = [("kruskal_test", lambda s, t: run_probe(s, t, args.subsets, args.timeout))]
            if args.audit:
                jobs.append(("audit", lambda s, t: run_audit(s, t, args.timeout * 5, tmp / f"{s}{t}")))
            for name, job in jobs:
                times = {case: min(job(*case) for _ in range(args.repeats)) for case in cases}
                b, a, one = times[("before", 2)], times[("after", 2)], times[("after", 1)]
                print(f"| {kind} | {name} | {b:.2f} s | {a:.2f} s | {one:.2f} s | {a / one:.2f}x "
                      f"| {a / b:.2f}x | {loadavg()} |", flush=True)
        finally:
            stop(procs)
    subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()
