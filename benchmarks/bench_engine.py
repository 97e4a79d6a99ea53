"""Batched ensemble training against a one-configuration-at-a-time loop, measured in the same run.

A grid of small memorization configurations (H x n x seeds, shared context, 100 classes) is trained
for the same number of steps twice: (1) batched on the shared engine, bucketed exactly as the sweeps do
(one ensemble per bucket, padding + masks for the different H and n), (2) sequentially, one single-member
ensemble after the other (the authors' way).
Early stopping is off on both sides so both do exactly the same updates; the script checks that the
two give the same final accuracies and (up to float reassociation) the same weights, then prints the
times and the ratio, in wall-clock and in this process's CPU time (the CPU ratio is the one to trust
on a machine shared with other jobs).

    python benchmarks/bench_engine.py --threads 1        # 16 configurations, N = 32, 300 steps
    python benchmarks/bench_engine.py --threads 1 --N 128 --batch-size 128

The gain on a CPU comes from paying the per-step overhead (dispatch, small ops) once per bucket instead
of once per configuration, so it shrinks as each configuration's own compute grows (larger N, H).
"""

from __future__ import annotations

import argparse
import time

import torch

from auditor.lab.common.mha.data import make_data
from auditor.lab.common.mha.model import MHAEnsemble
from auditor.lab.common.mha.task import MemorizeTask
from auditor.lab.common.mha.train import MemorizeSettings, buckets, grid
from auditor.lab.engine import TrainConfig, train


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heads", type=ints, default=[1, 2, 3, 4])
    parser.add_argument("--context", type=ints, default=[4, 8])
    parser.add_argument("--seeds", type=ints, default=[0, 1])
    parser.add_argument("--N", type=int, default=32)
    parser.add_argument("--d", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    runs = grid(args.heads, args.context, [args.d], [args.N], args.seeds, d=args.d, classes=100)
    datasets = [make_data(r.data_config()) for r in runs]
    config = TrainConfig(steps=args.steps, lr=1e-2, early_stop=False, eval_every=max(args.steps // 5, 1))
    max_n = max(args.context)
    print(
        f"{len(runs)} configurations: H in {args.heads}, n in {args.context}, seeds {args.seeds}, "
        f"d = d_h = {args.d}, "
        f"N = {args.N}, {args.steps} steps, batch {args.batch_size}, {torch.get_num_threads()} torch threads"
    )

    settings = MemorizeSettings(steps=args.steps, batch_size=args.batch_size)
    groups = buckets(runs, settings)  # as the sweeps bucket them (padding waste bounded)
    start, cpu = time.perf_counter(), time.process_time()
    batched_models, batched_acc = {}, {}
    for group in groups:
        members = [runs.index(r) for r in group]
        model = MHAEnsemble([r.model_config() for r in group], max_context=max_n)
        res = train(
            model, MemorizeTask([datasets[i] for i in members], args.batch_size), config, progress=False
        )
        for j, i in enumerate(members):
            batched_models[i], batched_acc[i] = model.member(j), float(res.accuracy[j])
    t_batched, c_batched = time.perf_counter() - start, time.process_time() - cpu

    start, cpu = time.perf_counter(), time.process_time()
    singles, accs = [], []
    for run, data in zip(runs, datasets):
        model = MHAEnsemble([run.model_config()], max_context=max_n)
        res = train(model, MemorizeTask([data], args.batch_size), config, progress=False)
        singles.append(model)
        accs.append(float(res.accuracy[0]))
    t_sequential, c_sequential = time.perf_counter() - start, time.process_time() - cpu

    acc_diff = max(abs(a - batched_acc[i]) for i, a in enumerate(accs))
    weight_diff = max(
        float((getattr(single, name) - getattr(batched_models[i], name)).detach().abs().max())
        for i, single in enumerate(singles)
        for name in ("W_Q", "W_K", "W_V", "W_O", "W_D")
    )
    print(f"{'':16}  {'wall s':>8}  {'CPU s':>8}")
    print(
        f"sequential loop : {t_sequential:8.2f}  {c_sequential:8.2f}  "
        f"({t_sequential / len(runs):.2f} s per configuration)"
    )
    print(
        f"batched ensemble: {t_batched:8.2f}  {c_batched:8.2f}  "
        f"({len(groups)} bucket(s) of {[len(g) for g in groups]})"
    )
    print(
        f"speed-up        : {t_sequential / t_batched:8.2f}x wall, {c_sequential / c_batched:.2f}x CPU time"
    )
    print(
        f"agreement       : max |accuracy difference| = {acc_diff:.3g}, "
        f"max |weight difference| = {weight_diff:.3g}"
    )


if __name__ == "__main__":
    main()
