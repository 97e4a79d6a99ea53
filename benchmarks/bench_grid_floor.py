"""Benchmark: the least work an exact tolerance grid adds to a Kruskal test, and what the default
call adds.

The default call of :func:`probes.kruskal_test` reports, beside the verdict, the share of full-rank subsets
at each point of the tolerance grid (0.1x ... 10x rtol), exactly as a float64 SVD would give it. Every
subset whose ratio r = sigma_k / sigma_1 lies between two grid points needs its own proof of where it
lies, and the plain test (``robustness=False``) proves only which side of rtol it is on. This script
measures, for the pools of ``bench_probes.py``, in one run:

- where the subsets' exact ratios lie on the grid (eigenvalues of every subset's float64 Gram block),
  and how many lie above 10x rtol but too close to it for a certificate built on the usual bound of
  lambda_max (trace, Gershgorin row sum, the pool's sigma_1^2) to prove it;
- the cost of the kernels on the fast path's worker threads, per k x k block: gathering the block from
  the pool Gram, one float64 Cholesky factorisation, the eigenvalues the fast path computes;
- the plain test and the default call, once each;
- a floor for the tolerance grid's extra cost: one factorisation (gathered block included) for each
  subset with r in (0.1, 1) or (2, 10) x rtol and each one the usual bound leaves open at 10x. Each of
  them needs a proven lower bound on r at a grid point other than rtol (or a tighter proven bound on
  lambda_max), which takes a factorisation of its own (or a spectrum, dearer); the plain test's one
  factorisation proves only r > rtol or r < rtol. Subsets in (1, 2) x rtol need only a proven upper
  bound below 2x, which a vector from the plain test's factor can give, and those below 0.1x are proven
  dependent there by the test's own factorisation: neither is counted.

With ``--general-position`` (k = d, the anisotropic pool of ``bench_probes.py``): the dependence proof
factorises every subset once and the exact-spectra route computes every subset's eigenvalues, so the
proof's gain over exact spectra is about the ratio of the two kernels (the dependence proof's power
steps and failing factorisation, :func:`probes.fast.prove_dependent`, against the eigenvalues, each on
the gathered block; the gathers, alike in both, only lower it); and a float32 certificate (the fast
path's stage 0, at about half the cost) cannot prove any subset whose
lambda_min / lambda_max lies below (k + 1) eps32 (Demmel's bound on a Cholesky factorisation's error,
with max_i g_ii >= lambda_max / k). The script counts those subsets.

    python benchmarks/bench_grid_floor.py                                  # bert, gpt2; both pools
    python benchmarks/bench_grid_floor.py --shapes vit --subsets 5000
    python benchmarks/bench_grid_floor.py --general-position
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `import probes` sets it

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_probes import POOLS, SHAPES, anisotropic_pool, checked_names, header, load, make_pool  # noqa: E402

import probes  # noqa: E402
from probes import fast  # noqa: E402
from probes.robust import DEFAULT_RTOL_GRID  # noqa: E402

_EDGES = (0.0, *DEFAULT_RTOL_GRID, math.inf)  # r / rtol intervals between the grid points
_STEP = 8  # blocks per chunk


def exact_ratios(pool: fast.Pool, subsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, slack) per subset: sigma_k / sigma_1 from the eigenvalues of its Gram block, and
    sqrt(lam_hi / lambda_max) for the usual bound lam_hi (a certificate at t with it proves r > t only
    where r > t * slack)."""
    parts = subsets.split(_STEP)

    def work(j: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = pool.gram64(parts[j])
        lam = fast.threads.eigvalsh(g)
        lmax = lam[:, -1]
        r = (lam[:, 0].clamp(min=0) / lmax).sqrt()
        return r, (fast.lam_hi_bound(g, pool.lam_cap) / lmax).sqrt()

    out = fast.map_chunks(work, len(parts), fast.workers())
    return torch.cat([r for r, _ in out]), torch.cat([s for _, s in out])


def kernel_ms(pool: fast.Pool, subsets: torch.Tensor, count: int) -> dict[str, float]:
    """Wall milliseconds per block on the fast path's worker threads (best of two): gathering the
    block as the fast path does (:meth:`probes.fast.Pool.gram64`), a float64 Cholesky factorisation, the
    dependence proof at rtol, the fast path's eigenvalues."""
    idx = subsets[:count]
    parts = idx.split(_STEP)
    pre = [pool.gram64(p).clone() for p in parts]  # (gram64 fills a buffer it reuses)
    lam_hi = [fast.lam_hi_bound(b, pool.lam_cap) for b in pre]
    kernels = {
        "gather": lambda j: pool.gram64(parts[j]),
        "cholesky": lambda j: torch.linalg.cholesky_ex(pre[j]),
        "proof": lambda j: fast.prove_dependent(pre[j], lam_hi[j], pool.rtol, pool.d),
        "eigenvalues": lambda j: fast.threads.eigvalsh(pre[j]),
    }
    out = {}
    for name, work in kernels.items():
        work(0)  # warm-up
        best = math.inf
        for _ in range(2):
            start = time.perf_counter()
            fast.map_chunks(work, len(parts), fast.workers())
            best = min(best, time.perf_counter() - start)
        out[name] = 1e3 * best / idx.shape[0]
    return out


def pool_of(x: torch.Tensor, k: int) -> fast.Pool:
    """The fast path's pool of the (N, d) vectors ``x`` for k-subsets: float64 rows and Gram, sigma_1^2
    as the cap on every lambda_max, rtol = max(k, d) eps of the vectors' dtype."""
    x64 = x.double()
    gram = x64 @ x64.T
    rtol = max(k, x.shape[1]) * torch.finfo(x.dtype).eps
    return fast.Pool(x64, gram, k, rtol, float(torch.linalg.eigvalsh(gram)[-1]), _STEP)


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    res = call()
    return time.perf_counter() - start, res


def run_pool(shape: str, kind: str, count: int, seed: int) -> None:
    n, d, k, _, _ = SHAPES[shape]
    x = make_pool(kind, n, d, k, seed)
    pool = pool_of(x, k)
    subsets = probes.sample_subsets(n, k, count, seed=seed)
    before = load()
    r, slack = exact_ratios(pool, subsets)
    q = r / pool.rtol
    counts = torch.histogram(q.clamp(max=1e300), torch.tensor(_EDGES[:-1] + (1e300,), dtype=torch.float64))
    bins = [int(c) for c in counts.hist]
    inside = int((((q > 0.1) & (q < 1)) | ((q > 2) & (q < 10))).sum())
    open10 = int(((q >= 10) & (q < 10 * slack)).sum())
    ms = kernel_ms(pool, subsets, min(count, 64))
    plain_s, plain = timed(lambda: probes.kruskal_test(x, k, subsets=count, seed=seed, robustness=False,
                                                       progress=False))
    default_s, default = timed(lambda: probes.kruskal_test(x, k, subsets=count, seed=seed, progress=False))
    assert (plain.fraction, plain.witness) == (default.fraction, default.witness)
    grid = default.robustness.rtol_grid
    full = (q > 1).double().mean()
    # the fractions the default call reported, against the ratios above (far from a grid point)
    for m, share in grid.items():
        exact = float((q > m).double().mean())
        assert abs(share - exact) <= 2 / count, (m, share, exact)
    least = (inside + open10) * (ms["gather"] + ms["cholesky"]) / 1e3
    print(f"| {shape} ({n}, {d}, {k}) | {kind} | {count} | {float(full):.3f} | {' / '.join(map(str, bins))} "
          f"| {inside} | {open10} (slack median {float(slack.median()):.2f}) "
          f"| {ms['gather']:.2f} / {ms['cholesky']:.2f} / {ms['eigenvalues']:.2f} "
          f"| {plain_s:.2f} | {default_s:.2f} ({default_s / plain_s:.2f}x) "
          f"| {least:.2f} ({(plain_s + least) / plain_s:.2f}x) | {0.3 * plain_s:.2f} | {before}/{load()} |",
          flush=True)


def run_general_position(count: int, seed: int, n: int = 1000, d: int = 768) -> None:
    x = anisotropic_pool(n, d, seed)
    k = d
    pool = pool_of(x, k)
    subsets = probes.sample_subsets(n, k, count, seed=seed)
    before = load()
    ms = kernel_ms(pool, subsets, min(count, 64))
    lam_ratio = exact_ratios(pool, subsets)[0] ** 2
    f32_floor = (k + 1) * torch.finfo(torch.float32).eps
    f32 = int((lam_ratio > f32_floor).sum())
    exact_s, a = timed(lambda: probes.kruskal_test(x, k, subsets=count, seed=seed, rank_sample=None,
                                                   robustness=False, progress=False))
    proof_s, b = timed(lambda: probes.kruskal_test(x, k, subsets=count, seed=seed, robustness=False,
                                                   progress=False))
    assert (a.fraction, a.witness) == (b.fraction, b.witness)
    most = ms["eigenvalues"] / ms["proof"]
    print("| shape (N, d = k) | subsets | gather / proof / eigenvalues (ms a block) | exact spectra (s) "
          "| proof (s) | proof's gain | eigenvalues / proof kernel | subsets float32 could certify "
          "| lambda_min / lambda_max median | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| ({n}, {d}) | {count} | {ms['gather']:.2f} / {ms['proof']:.2f} / {ms['eigenvalues']:.2f} "
          f"| {exact_s:.2f} | {proof_s:.2f} | {exact_s / proof_s:.2f}x | {most:.2f}x | {f32} "
          f"| {float(lam_ratio.median()):.2e} (float32 needs > {f32_floor:.1e}) "
          f"| {before}/{load()} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="bert,gpt2", help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--pools", default="gaussian,cluster", help="comma-separated: " + ", ".join(POOLS))
    parser.add_argument("--subsets", type=int, default=1000, help="subsets per pool (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--general-position", action="store_true",
                        help="general position at k = d = 768 instead (N = 1000)")
    args = parser.parse_args()
    shapes = checked_names(parser, args.shapes, SHAPES, "shape")
    pools = checked_names(parser, args.pools, POOLS, "pool")
    header(args, "cpu")
    if args.general_position:
        run_general_position(args.subsets, args.seed)
        return
    print("| shape (N, d, k) | pool | subsets | full-rank share | subsets per grid interval of r / rtol "
          "(<0.1 / 0.1-0.2 / ... / 5-10 / >10) | in (0.1, 1) or (2, 10) | open at 10x with the usual bound "
          "| gather / Cholesky / eigenvalues (ms a block) | plain (s) | default (s) "
          "| least extra for an exact grid (s) | 1.3x allows (s) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape in shapes:
        for kind in pools:
            run_pool(shape, kind, args.subsets, args.seed)


if __name__ == "__main__":
    main()
