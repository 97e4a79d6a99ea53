"""Capacity lab III: a batched sweep against a per-configuration loop, measured in the same run.

Two sweeps, each run twice:

1. the capacity of linear associative memories (bisection on N) for several d and seeds. Batched:
   one bucket per d, every seed's probe of a round trains in ONE ensemble (``run_bucket``, what
   ``audit assoc`` does). Loop: the same searches one seed at a time (a one-member ensemble per
   probe, the authors' way).
2. the attention-versus-MLP grid of factual recall. Batched: one ensemble per head count H holding
   every MLP width (``run_tradeoff_unit``, what ``audit recall tradeoff`` does). Loop: one model per
   (H, m) cell.

Both sides make the same updates on the same data (a member's data, initialisation and embeddings
depend only on its own configuration), so the script also checks that they reach the same capacities
and accuracies. It prints wall-clock and this process's CPU time; the CPU ratio is the one to trust on a
machine shared with other jobs.

    python benchmarks/bench_assoc.py                       # ~2 minutes on one core
    python benchmarks/bench_assoc.py --dims 8,11,16 --seeds 0,1,2,3,4,5,6,7
"""

from __future__ import annotations

import argparse
import time

import torch

from auditor.lab.assoc.experiment import AssocConfig, run_bucket
from auditor.lab.recall.tradeoff import TradeoffConfig, run_tradeoff_unit
from auditor.lab.recall.training import RecallTraining


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def report(name: str, batched: tuple, loop: tuple, agree: str) -> None:
    (_, wall_b, cpu_b), (_, wall_l, cpu_l) = batched, loop
    print(f"{name}")
    print(f"  batched: {wall_b:8.2f} s wall  {cpu_b:8.2f} s cpu")
    print(f"  loop:    {wall_l:8.2f} s wall  {cpu_l:8.2f} s cpu")
    print(f"  speed-up: {wall_l / wall_b:.2f}x wall, {cpu_l / cpu_b:.2f}x cpu; {agree}")


def bench_memory(dims: list[int], seeds: list[int], steps: int) -> None:
    config = AssocConfig(kind="linear", dims=tuple(dims), seeds=tuple(seeds), steps=steps, rel_tol=0.05)
    units = config.buckets()
    batched = timed(lambda: [row for unit in units for row in run_bucket(unit)])
    loop = timed(lambda: [row for unit in units for s in seeds for row in run_bucket({**unit, "seeds": [s]})])
    same = sum(a["capacity"] == b["capacity"] for a, b in zip(batched[0], loop[0]))
    caps = {(r["d"], r["seed"]): r["capacity"] for r in batched[0]}
    report(f"linear memory capacity: d in {dims}, seeds {seeds}, <= {steps} steps per probe",
           batched, loop, f"capacities equal for {same}/{len(caps)} (d, seed)")
    for d in dims:
        print(f"    d = {d}: capacities {[caps[(d, s)] for s in seeds]}")


def bench_recall(heads: list[int], widths: list[int], steps: int) -> None:
    training = RecallTraining(steps=steps, batch_size=128, eval_every=50, eval_contexts=2)
    config = TradeoffConfig(
        subjects=8,
        relations=8,
        d=16,
        head_dim=4,
        heads=tuple(heads),
        widths=tuple(widths),
        seeds=(0,),
        training=training,
    )
    units = config.units()
    batched = timed(lambda: [row for unit in units for row in run_tradeoff_unit(unit)])
    loop = timed(
        lambda: [row for unit in units for m in widths for row in run_tradeoff_unit({**unit, "widths": [m]})]
    )
    diff = max(abs(a["accuracy"] - b["accuracy"]) for a, b in zip(batched[0], loop[0]))
    report(f"recall trade-off grid: S=R=8, d=16, d_h=4, H in {heads}, m in {widths}, <= {steps} steps",
           batched, loop, f"largest accuracy difference {diff:.4f} over {len(batched[0])} cells")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dims", type=ints, default=[8, 11, 16])
    parser.add_argument("--seeds", type=ints, default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--memory-steps", type=int, default=512)
    parser.add_argument("--heads", type=ints, default=[1, 2, 4])
    parser.add_argument("--widths", type=ints, default=[0, 8, 16, 32, 64])
    parser.add_argument("--recall-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (small models: 1 is fastest)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{torch.get_num_threads()} torch thread(s)")
    bench_memory(args.dims, args.seeds, args.memory_steps)
    bench_recall(args.heads, args.widths, args.recall_steps)


if __name__ == "__main__":
    main()
