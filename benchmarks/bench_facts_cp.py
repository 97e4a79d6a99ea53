"""Batched sparse CP-ALS (facts room) against tensorly's dense parafac on the same database tensors.

Both fit the same rank for the same number of ALS sweeps and restarts (convergence checks disabled), on
random databases with 10 values per relation (rank certified = 10 x relations). tensorly runs one
restart at a time on the dense |K| x |Q| x |V| array; the batched ALS fits all restarts at once on the
non-zeros. Prints seconds per sweep of each and the ratio. ``--threads`` caps both torch and the BLAS
under numpy (tensorly's backend), and one untimed warm-up fit of each runs first, so that neither side
pays for thread start-up or first-call costs.

    python benchmarks/bench_facts_cp.py [--keys 500,1000] [--sweeps 20] [--restarts 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="250,500,1000", help="Database sizes (keys; 10 relations each).")
    parser.add_argument("--sweeps", type=int, default=20)
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # before numpy loads its BLAS
    import numpy as np
    import torch
    from tensorly.decomposition import parafac

    torch.set_num_threads(args.threads)

    from auditor.lab.facts.cp import CPConfig, batched_cp_als
    from auditor.lab.facts.database import DatabaseSpec
    from auditor.lab.facts.tensor import dense_tensor

    warm = dense_tensor(DatabaseSpec(keys=20, queries=4, values_per_query=3).build())
    parafac(warm, 4, n_iter_max=2, init="random", random_state=0, tol=0)
    batched_cp_als(np.argwhere(warm), warm[warm != 0], warm.shape, [(4, 0)], CPConfig(max_iter=2))
    print("| triples | shape | rank | tensorly s/sweep | batched ALS s/sweep | speed-up |")
    print("|---:|---|---:|---:|---:|---:|")
    for keys in (int(k) for k in args.keys.split(",")):
        db = DatabaseSpec(keys=keys, queries=10, values_per_query=10).build()
        dense = dense_tensor(db)
        rank = 100
        t0 = time.perf_counter()
        for restart in range(args.restarts):
            parafac(dense, rank, n_iter_max=args.sweeps, init="random", random_state=restart, tol=0)
        tl_time = (time.perf_counter() - t0) / (args.sweeps * args.restarts)
        coords = np.argwhere(dense)
        values = dense[tuple(coords.T)]
        config = CPConfig(
            tolerance=1e-30, max_iter=args.sweeps
        )  # no early stop: every member runs every sweep
        t0 = time.perf_counter()
        batched_cp_als(coords, values, dense.shape, [(rank, r) for r in range(args.restarts)], config)
        als_time = (time.perf_counter() - t0) / (args.sweeps * args.restarts)
        shape = "x".join(map(str, dense.shape))
        print(
            f"| {db.num_triples} | {shape} | {rank} | "
            f"{tl_time:.4f} | {als_time:.4f} | {tl_time / als_time:.1f}x |"
        )


if __name__ == "__main__":
    main()
