"""Benchmark: Kruskal-rank tests at the paper's shapes, fast path against a per-subset matrix_rank loop.

The baseline is what the paper's notebooks did: for each random k-subset, ``torch.linalg.matrix_rank``
on the (k, d) float32 matrix, one subset at a time. The fast path is :func:`probes.kruskal_test`
(float64 pool Gram, float32 and float64 shifted Cholesky certificates, exact fallbacks; see
``probes/fast/``). Both see the same subsets, in the same run; the script prints both times, the
ratio, and whether every verdict and rank agrees. Both times are the best of ``--repeats`` runs
(default 2; the first run of a process also pays one-off costs such as thread start-up, and a shared
machine's noise only ever adds time); the loop runs over ``--baseline-subsets`` subsets and is scaled
to the test's count. The ratio compares like with like: the test with
``robustness=False`` (the loop computes no tolerance fields either); the default call, which also
says how far each verdict is from flipping (``probes/robust.py``), is timed beside it with its own
ratio. For scale it also measures, in the same run:

- the floor: the pool Gram plus one float64 Cholesky factorisation of every subset's k x k block
  (blocks gathered beforehand, untimed), on as many threads as the fast path uses; and the same with
  float32 factorisations (what stage 0 of the fast path computes for well-conditioned subsets);
- the machine's dense-kernel peak: a 4096 x 4096 float64 GEMM at the default thread count;
- the fast path's achieved rate: useful float64 work (N^2 d for the Gram, k^3 / 3 per factorisation)
  over its wall time.

Every table line carries the load average (1 minute) before and after it: ratios are only comparable
between runs on an equally quiet machine.

    python benchmarks/bench_probes.py                      # ViT: N=2000, d=768, k=197, 5000 subsets
    python benchmarks/bench_probes.py --shapes vit,bert,gpt2 --baseline-subsets 200
    python benchmarks/bench_probes.py --general-position   # k = d: dependence proof vs exact spectra
    python benchmarks/bench_probes.py --robustness         # cost of the tolerance fields (probes.robust)
    python benchmarks/bench_probes.py --robustness --shapes vit,bert,gpt2 --large-subsets 1000
    OMP_NUM_THREADS=1 python benchmarks/bench_probes.py --robustness --cpu-time   # on a loaded machine
    python benchmarks/bench_probes.py --robustness --shapes bert --pool-size bert=1000 --large-subsets 300
    python benchmarks/bench_probes.py --robustness --general-position
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time

# The loop baseline runs in a child process with the environment the benchmark was started with: the
# paper's notebooks ran plain torch, whose OpenMP workers spin while they wait, and the passive policy
# set below makes that loop of small calls about 3x slower (2 cores, ViT shape), which would flatter
# the fast path.
USER_ENV = dict(os.environ)
# As `audit` and `import probes` do: OpenMP workers sleep rather than spin while they wait, set before
# torch starts its OpenMP runtime (beside another torch job, spinning teams take turns at a crawl).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import probes  # noqa: E402
from probes import fast as fastpath  # noqa: E402

# name: (N, d, k, default subsets, default loop subsets)
SHAPES = {
    "vit": (2000, 768, 197, 5000, 500),  # ViT-B/16: 197 tokens of width 768
    "bert": (2000, 1024, 512, 5000, 100),  # BERT-large-like: 512 tokens of width 1024
    "gpt2": (2000, 1280, 1024, 5000, 40),  # GPT-2-large-like: 1024 tokens of width 1280
}


def load() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return fh.read().split()[0]
    except OSError:
        return "?"


def make_pool(kind: str, n: int, d: int, k: int, seed: int) -> torch.Tensor:
    """``gaussian``: i.i.d. N(0, 1). ``cluster``: half the vectors lie in a (k // 2)-dim subspace, so
    about half of the k-subsets hold too many of them and are dependent (exercises the fallbacks)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    if kind == "cluster":
        r = k // 2
        x[: n // 2] = torch.randn(n // 2, r, generator=g) @ torch.randn(r, d, generator=g)
    return x


_LOOP = """
import json, sys, time
import torch
x, subsets, repeats = torch.load(sys.argv[1], weights_only=True)
best = float("inf")
for _ in range(repeats):
    ranks = torch.empty(subsets.shape[0], dtype=torch.int64)
    start = time.perf_counter()
    for i in range(subsets.shape[0]):
        ranks[i] = torch.linalg.matrix_rank(x[subsets[i]])
    if x.is_cuda:
        torch.cuda.synchronize()
    best = min(best, time.perf_counter() - start)
print(json.dumps({"seconds": best, "ranks": ranks.tolist()}))
"""


def baseline(x: torch.Tensor, subsets: torch.Tensor, repeats: int) -> tuple[float, torch.Tensor]:
    """(best seconds of ``repeats`` runs, ranks) of the per-subset ``matrix_rank`` loop, in a child
    process with the environment this benchmark started with (plain torch: see ``USER_ENV``)."""
    print(f"# timing the matrix_rank loop on {subsets.shape[0]} subsets in a child process ...",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "loop.pt")
        torch.save((x, subsets, max(1, repeats)), path)
        done = subprocess.run([sys.executable, "-c", _LOOP, path], env=USER_ENV, capture_output=True,
                              text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["seconds"], torch.tensor(out["ranks"], dtype=torch.int64)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gemm_peak(device: str, dtype: torch.dtype = torch.float64, n: int = 4096) -> float:
    """GFLOP/s of an n x n x n GEMM (best of 3) at the default thread count."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    a @ b
    sync(device)
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def factorisation_floor(x64: torch.Tensor, subsets: torch.Tensor, count: int, total: int,
                        dtype: torch.dtype) -> float:
    """Seconds for one k x k Cholesky factorisation per subset, for ``total`` subsets, measured on the
    blocks of the first ``count`` (gathered beforehand) and scaled; on CPU with one thread per worker
    like the fast path."""
    gram = x64 @ x64.T
    k = subsets.shape[1]
    step = max(1, fastpath.tuning.TUNING.cache_bytes // (8 * k * k))
    idx = subsets[:count].to(x64.device)
    blocks = [gram[i[:, :, None], i[:, None, :]].to(dtype) for i in idx.split(step)]
    del gram
    if x64.device.type != "cpu":
        sync(str(x64.device))
        start = time.perf_counter()
        for b in blocks:
            torch.linalg.cholesky_ex(b)
        sync(str(x64.device))
        return (time.perf_counter() - start) * total / count
    threads = torch.get_num_threads()
    workers = min(fastpath.tuning.TUNING.max_workers, threads)

    def work(part: list[torch.Tensor]) -> None:
        torch.set_num_threads(max(1, threads // workers))
        for b in part:
            torch.linalg.cholesky_ex(b)

    for b in blocks[:2]:  # warm-up
        torch.linalg.cholesky_ex(b)
    start = time.perf_counter()
    pool = [threading.Thread(target=work, args=(blocks[w::workers],)) for w in range(workers)]
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        torch.set_num_threads(threads)
    return (time.perf_counter() - start) * total / count


def pool_gram_seconds(x64: torch.Tensor) -> float:
    x64 @ x64.T
    sync(str(x64.device))
    start = time.perf_counter()
    x64 @ x64.T
    sync(str(x64.device))
    return time.perf_counter() - start


def run(kind: str, shape: str, args: argparse.Namespace, device: str, peak: float) -> dict:
    n, d, k, default_subsets, default_loop = SHAPES[shape]
    count = (args.large_subsets if shape != "vit" and args.large_subsets else args.subsets) or default_subsets
    load_before = load()
    x = make_pool(kind, n, d, k, args.seed).to(device)
    subsets = probes.sample_subsets(n, k, count, seed=args.seed)
    sync(device)
    t_plain = t_fast = math.inf
    for _ in range(max(1, args.repeats)):  # best of --repeats, interleaved
        start = time.perf_counter()
        plain = probes.kruskal_test(x, k, subsets=count, seed=args.seed, robustness=False)
        sync(device)
        t_plain = min(t_plain, time.perf_counter() - start)
        start = time.perf_counter()
        fast = probes.kruskal_test(x, k, subsets=count, seed=args.seed)  # the default: with robustness
        sync(device)
        t_fast = min(t_fast, time.perf_counter() - start)
    load_fast = load()
    assert (plain.fraction, plain.witness, plain.rank_counts) == (
        fast.fraction,
        fast.witness,
        fast.rank_counts,
    )
    # the loop's subsets, re-decided with an exact rank for every subset, for the comparison
    x64 = x.double()
    nb = min(args.baseline_subsets or default_loop, count)
    dec = fastpath.subset_decisions(x64, subsets[:nb].to(device), fast.rtol, x64 @ x64.T)
    seconds, ref = baseline(x, subsets[:nb].to(device), args.repeats)  # best of --repeats, like the fast path
    t_loop = seconds * count / nb
    agree = bool(((dec.rank[:nb].cpu() == k) == (ref.cpu() == k)).all())
    same_rank = bool((dec.rank[:nb].cpu() == ref.cpu()).all())
    m = min(count, max(nb, 8))
    t_gram = pool_gram_seconds(x64)
    floor64 = t_gram + factorisation_floor(x64, subsets, m, count, torch.float64)
    floor32 = t_gram + factorisation_floor(x64, subsets, m, count, torch.float32)
    useful = n * n * d + count * k**3 / 3  # float64 flop of the Gram (symmetric) and the factorisations
    return dict(pool=kind, shape=shape, n=n, d=d, k=k, subsets=count, fraction=fast.fraction, fast_s=t_fast,
                plain_s=t_plain, loop_s=t_loop, ratio=t_loop / t_plain, ratio_default=t_loop / t_fast,
                floor64=floor64, floor32=floor32, gflops=useful / t_plain / 1e9, peak=peak,
                verdicts_agree=agree, ranks_agree=same_rank, stages=plain.stages, extrapolated=nb < count,
                loop_n=nb, load=f"{load_before}/{load_fast}/{load()}")


def anisotropic_pool(n: int, d: int, seed: int) -> torch.Tensor:
    """Tokens like a random ViT block's CLS outputs: a common mean plus a spectrum falling one
    decade, so the pool has full rank d but most d-subsets are rank-deficient at float32 tolerance."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -1, d)
    x = torch.randn(n, d, generator=g) * scales + 3 * torch.randn(1, d, generator=g)
    return x.float()


def run_general_position(args: argparse.Namespace, device: str) -> dict:
    """General position at k = d: every subset's exact spectrum (rank_sample=None) against the
    shifted-Cholesky dependence proof (100 exact ranks), both without the tolerance fields; and the
    default call (dependence proof with the tolerance fields) beside them. Best of --repeats each."""
    n = min(args.n, 1000)
    x = anisotropic_pool(n, args.d, args.seed).to(device)
    times, results, loads = {}, {}, [load()]
    runs = (("exact spectra", None, False), ("dependence proof", 100, False), ("default", 100, True))
    for _ in range(max(1, args.repeats)):  # best of --repeats, interleaved
        for label, sample, robustness in runs:
            start = time.perf_counter()
            results[label] = probes.kruskal_test(x, args.d, subsets=args.gp_subsets, seed=args.seed,
                                                 rank_sample=sample, robustness=robustness, progress=False)
            sync(device)
            times[label] = min(times.get(label, math.inf), time.perf_counter() - start)
        loads.append(load())
    a, b, c = (results[label] for label, _, _ in runs)
    return dict(n=n, fraction=b.fraction, exact_s=times["exact spectra"], proof_s=times["dependence proof"],
                default_s=times["default"], ratio=times["exact spectra"] / times["dependence proof"],
                same=(a.fraction, a.witness) == (b.fraction, b.witness) == (c.fraction, c.witness),
                stages=b.stages, load="/".join(loads))


def run_robustness(kind: str, x: torch.Tensor, k: int, count: int, seed: int, device: str, repeats: int,
                   clock=time.perf_counter, rank_sample: int | None = 100) -> dict:
    """The same Kruskal test with and without the tolerance fields (best of ``repeats`` each, interleaved);
    ``clock``: ``time.process_time`` for CPU time (--cpu-time)."""
    best = {False: math.inf, True: math.inf}
    res = {}
    loads = [load()]
    for _ in range(repeats):
        for on in (False, True):
            start = clock()
            res[on] = probes.kruskal_test(x, k, subsets=count, seed=seed, robustness=on, progress=False,
                                          rank_sample=rank_sample)
            sync(device)
            best[on] = min(best[on], clock() - start)
        loads.append(load())
    r = res[True]
    # (the stage counts may differ: the tolerance fields need ceilings that stage 0b does not give)
    same = (res[False].fraction, res[False].witness, res[False].rank_counts) == (
        r.fraction,
        r.witness,
        r.rank_counts,
    )
    return dict(
        pool=kind,
        k=k,
        subsets=count,
        fraction=r.fraction,
        plain_s=best[False],
        robust_s=best[True],
        ratio=best[True] / best[False],
        same=same,
        critical=(r.robustness.critical_rtol_low, r.robustness.critical_rtol_high),
        exact=r.robustness.exact(r.rtol),
        grid=r.robustness.rtol_grid,
        rtol=r.rtol,
        margin=(res[False].min_margin, r.min_margin, r.robustness.margin_bound),
        load="/".join(loads),
    )


def print_robustness(rows: list[dict]) -> None:
    print("| pool | k | subsets | fraction | plain (s) | with robustness (s) | ratio | same verdicts "
          "| critical_rtol bracket / rtol (exact?) | min_margin plain -> robust (bound?) | load 1-min |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["critical"]
        m0, m1, bound = r["margin"]
        print(
            f"| {r['pool']} | {r['k']} | {r['subsets']} | {r['fraction']:.4f} | {r['plain_s']:.2f} | "
            f"{r['robust_s']:.2f} | {r['ratio']:.2f}x | {r['same']} | "
            f"[{lo / r['rtol']:.4g}, {hi / r['rtol']:.4g}] ({r['exact']}) "
            f"| {m0:.3f} -> {m1:.4f} ({bound}) | {r['load']} |",
            flush=True,
        )
        grid = r["grid"] or {}
        print(f"#   grid: {', '.join(f'{m:g}x {f:.4f}' for m, f in grid.items())}", flush=True)


POOLS = ("gaussian", "cluster")  # the kinds of :func:`make_pool`


def checked_names(parser: argparse.ArgumentParser, text: str, valid, what: str) -> list[str]:
    """The comma-separated names of ``text`` (e.g. ``--shapes``), each one of ``valid`` (else the
    parser's one-line error, before anything runs)."""
    names = text.split(",")
    for name in names:
        if name not in valid:
            parser.error(f"unknown {what} {name!r}; valid: {', '.join(valid)}")
    return names


def _pool_sizes(text: str) -> dict[str, int]:
    """``bert=1000,gpt2=1500`` -> {"bert": 1000, "gpt2": 1500}."""
    out = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in SHAPES or not value.isdigit():
            known = ", ".join(SHAPES)
            raise argparse.ArgumentTypeError(f"expected shape=N, shape one of {known}; got {item!r}")
        out[name] = int(value)
    return out


def header(args: argparse.Namespace, device: str) -> None:
    print(f"# probes benchmark: device={device} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"cpu={platform.processor() or platform.machine()} cores={os.cpu_count()} load={load()}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="vit", help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--subsets", type=int, default=None,
                        help="subsets per test (default 5000, as audit --subsets)")
    parser.add_argument("--large-subsets", type=int, default=None, help="subsets for bert and gpt2 only")
    parser.add_argument(
        "--baseline-subsets",
        type=int,
        default=None,
        help="time the loop on this many subsets and scale (default: vit 500, bert 100, gpt2 40)",
    )
    parser.add_argument("--pools", default="gaussian,cluster")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--general-position", action="store_true",
                        help="benchmark general position at k = d instead (N = min(n, 1000))")
    parser.add_argument("--n", type=int, default=2000, help="general position: pool size (at most 1000 used)")
    parser.add_argument("--d", type=int, default=768, help="general position: width = k")
    parser.add_argument("--gp-subsets", type=int, default=1000)
    parser.add_argument("--robustness", action="store_true",
                        help="time kruskal_test with and without the tolerance fields instead")
    parser.add_argument("--cpu-time", action="store_true",
                        help="--robustness: time by the process's CPU time instead of the wall clock (for a "
                             "loaded machine; use with one thread, OMP_NUM_THREADS=1)")
    parser.add_argument("--pool-size", type=_pool_sizes, default={},
                        help="--robustness: N per shape instead of 2000, e.g. bert=1000,gpt2=1500")
    parser.add_argument("--rank-sample", type=int, default=100,
                        help="--robustness: kruskal_test's rank_sample (exact ranks for the histogram)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="best of this many runs of the fast path and of the loop (--robustness: of each call)",
    )
    args = parser.parse_args()
    shapes = checked_names(parser, args.shapes, SHAPES, "shape")
    pools = checked_names(parser, args.pools, POOLS, "pool")
    clock = time.process_time if args.cpu_time else time.perf_counter
    header(args, args.device)
    if args.robustness:
        if args.general_position:
            n = min(args.n, 1000)
            x = anisotropic_pool(n, args.d, args.seed).to(args.device)
            print_robustness([run_robustness("anisotropic", x, args.d, args.gp_subsets, args.seed,
                                             args.device, args.repeats, clock, args.rank_sample)])
            return
        rows = []
        for shape in shapes:
            n, d, k, default_subsets, _ = SHAPES[shape]
            n = args.pool_size.get(shape, n)
            count = (
                args.large_subsets if shape != "vit" and args.large_subsets else args.subsets
            ) or default_subsets
            print(f"# {shape}: N={n} d={d} k={k} subsets={count} rank_sample={args.rank_sample}", flush=True)
            rows += [
                run_robustness(kind, make_pool(kind, n, d, k, args.seed).to(args.device), k, count, args.seed,
                               args.device, args.repeats, clock, args.rank_sample)
                for kind in pools
            ]
        print_robustness(rows)
        return
    if args.general_position:
        r = run_general_position(args, args.device)
        print(f"# general position: N={r['n']} d=k={args.d} subsets={args.gp_subsets}")
        print("| full-rank fraction | exact spectra (s) | dependence proof (s) | ratio | default, with "
              "robustness (s) | same verdicts | stages | load 1-min (start/.../end) |")
        print("|---|---|---|---|---|---|---|---|")
        stages = ", ".join(f"{k} {v}" for k, v in r["stages"].items())
        print(f"| {r['fraction']:.4f} | {r['exact_s']:.1f} | {r['proof_s']:.1f} | {r['ratio']:.1f}x | "
              f"{r['default_s']:.1f} | {r['same']} | {stages} | {r['load']} |")
        return
    peak = gemm_peak(args.device)
    peak32 = gemm_peak(args.device, torch.float32)
    print(
        f"# dense-kernel peak (4096^3 GEMM, {torch.get_num_threads()} threads): float64 {peak:.1f} GFLOP/s, "
        f"float32 {peak32:.1f} GFLOP/s"
    )
    print("| shape (N, d, k) | pool | subsets | full-rank fraction | test (s) | matrix_rank loop (s) | ratio "
          "| default, with robustness (s) | ratio | floor f64 / f32 (s) | test / floor f64 "
          "| achieved GFLOP/s (% of f64 peak) | verdicts agree | ranks agree | fast-path stages "
          "| load 1-min (start/fast/end) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for kind in pools:
            r = run(kind, shape, args, args.device, peak)
            loop = f"{r['loop_s']:.1f}" + (f" (scaled from {r['loop_n']})" if r["extrapolated"] else "")
            stages = ", ".join(f"{k} {v}" for k, v in r["stages"].items() if v)
            print(
                f"| {shape} ({r['n']}, {r['d']}, {r['k']}) | {kind} | {r['subsets']} | {r['fraction']:.4f} "
                f"| {r['plain_s']:.2f} | {loop} | {r['ratio']:.1f}x "
                f"| {r['fast_s']:.2f} | {r['ratio_default']:.1f}x "
                f"| {r['floor64']:.2f} / {r['floor32']:.2f} "
                f"| {r['plain_s'] / r['floor64']:.2f} "
                f"| {r['gflops']:.1f} ({100 * r['gflops'] / r['peak']:.0f}%) "
                f"| {r['verdicts_agree']} | {r['ranks_agree']} | {stages} | {r['load']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
