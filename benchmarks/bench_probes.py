"""Benchmark: Assumption 1 at the paper's ViT scale, fast path against a per-subset matrix_rank loop.

The baseline is what the paper's notebooks did: for each random k-subset, ``torch.linalg.matrix_rank``
on the (k, d) float32 matrix, one subset at a time. The fast path is :func:`probes.kruskal_test`
(float64 pool Gram, batched shifted Cholesky, exact fallbacks). Both see the same subsets; the script
prints both times, the ratio, and whether every verdict agrees.

    python benchmarks/bench_probes.py                    # N=2000, d=768, k=197, 5000 subsets
    python benchmarks/bench_probes.py --baseline-subsets 1000   # time the loop on the first 1000
    python benchmarks/bench_probes.py --general-position  # k = d on ViT-like tokens: the dependence
                                                          # proof against exact spectra for every subset
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from tqdm.auto import tqdm

import probes


def make_pool(kind: str, n: int, d: int, k: int, seed: int) -> torch.Tensor:
    """``gaussian``: i.i.d. N(0, 1). ``cluster``: half the vectors lie in a (k // 2)-dim subspace, so
    about half of the k-subsets hold too many of them and are dependent (exercises the fallbacks)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    if kind == "cluster":
        r = k // 2
        x[: n // 2] = torch.randn(n // 2, r, generator=g) @ torch.randn(r, d, generator=g)
    return x


def baseline(x: torch.Tensor, subsets: torch.Tensor, desc: str) -> torch.Tensor:
    ranks = torch.empty(subsets.shape[0], dtype=torch.int64)
    for i in tqdm(range(subsets.shape[0]), desc=desc, leave=False, disable=None):
        ranks[i] = torch.linalg.matrix_rank(x[subsets[i]])
    return ranks


def run(kind: str, args: argparse.Namespace, device: str) -> dict:
    x = make_pool(kind, args.n, args.d, args.k, args.seed).to(device)
    subsets = probes.sample_subsets(args.n, args.k, args.subsets, seed=args.seed)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fast = probes.kruskal_test(x, args.k, subsets=args.subsets, seed=args.seed)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t_fast = time.perf_counter() - start
    # the same subsets, re-decided one by one for the verdict comparison
    dec = probes._fast.subset_decisions(x.double(), subsets.to(device), fast.rtol,
                                        x.double() @ x.double().T)
    nb = min(args.baseline_subsets or args.subsets, args.subsets)
    start = time.perf_counter()
    ref = baseline(x, subsets[:nb].to(device), f"{kind} loop")
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t_loop = (time.perf_counter() - start) * args.subsets / nb
    agree = bool(((dec.rank[:nb].cpu() == args.k) == (ref.cpu() == args.k)).all())
    same_rank = bool((dec.rank[:nb].cpu() == ref.cpu()).all())
    return dict(pool=kind, device=device, fraction=fast.fraction, fast_s=t_fast, loop_s=t_loop,
                ratio=t_loop / t_fast, verdicts_agree=agree, ranks_agree=same_rank, stages=fast.stages,
                extrapolated=nb < args.subsets)


def anisotropic_pool(n: int, d: int, seed: int) -> torch.Tensor:
    """Tokens like a random ViT block's CLS outputs: a common mean plus a spectrum falling one
    decade, so the pool has full rank d but most d-subsets are rank-deficient at float32 tolerance."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -1, d)
    x = torch.randn(n, d, generator=g) * scales + 3 * torch.randn(1, d, generator=g)
    return x.float()


def run_general_position(args: argparse.Namespace, device: str) -> dict:
    """General position at k = d: every subset's exact spectrum (rank_sample=None, the previous
    behaviour) against the shifted-Cholesky dependence proof (default, 100 exact ranks)."""
    n = min(args.n, 1000)
    x = anisotropic_pool(n, args.d, args.seed).to(device)
    times, results = {}, {}
    for label, sample in (("exact spectra", None), ("dependence proof", 100)):
        start = time.perf_counter()
        results[label] = probes.kruskal_test(x, args.d, subsets=args.gp_subsets, seed=args.seed,
                                             rank_sample=sample)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times[label] = time.perf_counter() - start
    a, b = results["exact spectra"], results["dependence proof"]
    return dict(n=n, fraction=b.fraction, exact_s=times["exact spectra"], proof_s=times["dependence proof"],
                ratio=times["exact spectra"] / times["dependence proof"],
                same=(a.fraction, a.witness) == (b.fraction, b.witness), stages=b.stages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--d", type=int, default=768)
    parser.add_argument("--k", type=int, default=197)
    parser.add_argument("--subsets", type=int, default=5000)
    parser.add_argument("--baseline-subsets", type=int, default=None,
                        help="time the loop on this many subsets and scale to --subsets (default: all)")
    parser.add_argument("--pools", default="gaussian,cluster")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--general-position", action="store_true",
                        help="benchmark general position at k = d instead (N = min(n, 1000))")
    parser.add_argument("--gp-subsets", type=int, default=1000)
    args = parser.parse_args()
    if args.general_position:
        r = run_general_position(args, args.device)
        print(f"# general position: N={r['n']} d=k={args.d} subsets={args.gp_subsets} device={args.device} "
              f"threads={torch.get_num_threads()} torch={torch.__version__}")
        print("| full-rank fraction | exact spectra (s) | dependence proof (s) | ratio | same verdicts | stages |")
        print("|---|---|---|---|---|---|")
        stages = ", ".join(f"{k} {v}" for k, v in r["stages"].items())
        print(f"| {r['fraction']:.4f} | {r['exact_s']:.1f} | {r['proof_s']:.1f} | {r['ratio']:.1f}x | "
              f"{r['same']} | {stages} |")
        return
    print(f"# probes benchmark: N={args.n} d={args.d} k={args.k} subsets={args.subsets} "
          f"device={args.device} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"cpu={platform.processor() or platform.machine()}")
    print("| pool | device | full-rank fraction | fast (s) | matrix_rank loop (s) | ratio | verdicts agree "
          "| ranks agree | fast-path stages |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in args.pools.split(","):
        r = run(kind, args, args.device)
        loop = f"{r['loop_s']:.1f}" + (" (scaled)" if r["extrapolated"] else "")
        stages = ", ".join(f"{k} {v}" for k, v in r["stages"].items())
        print(f"| {kind} | {r['device']} | {r['fraction']:.4f} | {r['fast_s']:.2f} | {loop} | "
              f"{r['ratio']:.1f}x | {r['verdicts_agree']} | {r['ranks_agree']} | {stages} |", flush=True)


if __name__ == "__main__":
    main()
