"""Benchmark: the certified Kruskal lower bound (probes.kruskal_lower_bound) on real tokens.

Reads token files written by ``audit ... --save-tokens`` and bounds, per file, the two vector sets the
audit bounds: the queries (Assumption 1, general position) and the mixed vectors e(t) + mean E(t)
(Assumption 3), at the audit's tolerance ``rtol = d eps(float32)``. Prints one markdown table row per
set: the bound without whitening (``--before``: the raw coherence and Babel bounds), the bound with the
defaults, the proof that gave it, the linear programs solved, the CPU seconds of the call (one torch
thread unless ``--threads``) with the wall time in brackets, and the load average (1 minute) before
each call: CPU seconds are what to compare on a shared machine.

    audit minilm --data ../shared/data/wikitext-2 --samples 1000 -w pretrained --layers 0,5 \\
        --save-tokens --threads 1 -o /tmp/minilm1000
    python benchmarks/bench_certify.py /tmp/minilm1000/tokens/*.safetensors --before
    python benchmarks/bench_certify.py /tmp/vit1000/tokens/block.0@random.safetensors --vectors queries
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from auditor.audit.tokens import Tokens
from probes.bounds import NULLSPACE_SECONDS, kruskal_lower_bound
from probes.spark import REFINE_STEPS


def load() -> str:
    with open("/proc/loadavg") as fh:
        return fh.read().split()[0]


def vector_sets(path: Path, which: list[str]) -> list[tuple[str, torch.Tensor]]:
    """The audit's vector sets of one token file: (name, (N, d) tensor)."""
    tokens = Tokens.load(path)
    sets = {"queries": lambda: tokens.queries,  # (N, d) as extracted
            "mixed": lambda: tokens.queries.to(torch.float64) + tokens.contexts.to(torch.float64).mean(dim=1)}
    return [(name, sets[name]()) for name in which]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="token files (.safetensors from --save-tokens)")
    parser.add_argument("--vectors", default="queries,mixed", help="comma list of: queries, mixed")
    parser.add_argument("--before", action="store_true", help="also the bound without whitening")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--steps", type=int, default=REFINE_STEPS, help="nullspace_steps")
    parser.add_argument("--seconds", type=float, default=NULLSPACE_SECONDS, help="nullspace_seconds")
    args = parser.parse_args()
    which = [v.strip() for v in args.vectors.split(",") if v.strip()]
    bad = sorted(set(which) - {"queries", "mixed"})
    if bad:
        parser.error(f"unknown vector set(s) {bad}; valid: queries, mixed")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), steps {args.steps}, "
          f"LP cap {args.seconds:g} s, pid {os.getpid()}")
    print("| layer | vectors | N | d | before | now | method | exact | LPs | CPU s (wall) | load |")
    print("|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for path in args.files:
        layer = path.name.removesuffix(".safetensors")
        for name, x in vector_sets(path, which):
            n_vec, d = x.shape
            rtol = d * torch.finfo(torch.float32).eps
            before = ""
            if args.before:
                before = str(kruskal_lower_bound(x, rtol=rtol, whiten=False).lower)
            load_before = load()
            cpu, wall = time.process_time(), time.perf_counter()
            res = kruskal_lower_bound(x, rtol=rtol, nullspace_steps=args.steps,
                                      nullspace_seconds=args.seconds)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            print(f"| {layer} | {name} | {n_vec} | {d} | {before} | {res.lower} | {res.method} | "
                  f"{'yes' if res.exact else 'no'} | {res.nullspace_programs} | {cpu:.1f} ({wall:.0f}) | "
                  f"{load_before} |", flush=True)


if __name__ == "__main__":
    main()
