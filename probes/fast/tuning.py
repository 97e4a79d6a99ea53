"""The cost switches of the fast path, in one frozen dataclass.

None of these decides a rank, a verdict, a witness or a rank histogram: they choose which proof runs
first, how much work goes into one batched call and when a cheaper route is worth trying (the proofs
and their error bounds are in :mod:`probes.fast.errors`). Each field says the measurement that set it,
taken on the 2-core CPU machine with ``benchmarks/bench_probes.py`` (ViT shape N = 2000, d = 768,
k = 197; the larger shapes k = 512 and 1024), or says that it was set by reasoning, not measured.

Tests change a field with ``dataclasses.replace`` on :data:`TUNING` (``monkeypatch.setattr``); the
library reads ``tuning.TUNING`` once per call and passes it down.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    """Cost switches of :mod:`probes.fast` and :mod:`probes.robust` (see the module docstring)."""

    # ---- chunks and threads
    cache_bytes: int = 16 * 2**20  # float64 blocks per chunk: 4 MB ran 5-20% slower at k = 197 (the
    # per-chunk overhead of a few dozen batched calls), session 5 of reports/benchmarks.md
    max_chunk: int = 4096  # subsets per chunk at most (small k); set by reasoning, not measured
    max_workers: int = 4  # Python threads over chunks, one torch thread each (LAPACK calls on small
    # matrices use a second thread poorly, and a loaded machine stalls them: 0045983); capped by torch's
    # thread count, so 2 on the 2-core machine
    min_parallel_flop: float = 2e8  # below this much Cholesky work the chunks run in the calling thread
    # (thread start-up beside a few ms of work); set by reasoning, not measured
    context_bytes: int = 256 * 2**20  # memory budget of a chunk of contexts (:func:`chunk_size`)
    device_bytes: int = 2**30  # off the CPU (a GPU): float64 k x k blocks per chunk of subsets instead of
    # ``cache_bytes`` (3.5k subsets at k = 197, 128 at k = 1024), so that a test runs in a few chunks and
    # its kernel launches and host reads do not grow with the subsets (each chunk costs a fixed number of
    # both; tests/test_probes/test_sync_counts.py counts them); the stages hold a few copies of the blocks,
    # a few GB. Set by reasoning, not measured on a GPU yet (reports/gpu-profile.md)
    device_max_chunk: int = 2**16  # subsets per chunk at most off the CPU (small k); by reasoning

    # ---- the margin floor (module docstring of probes.fast.stages)
    pilot: int = 16  # subsets given their own margin bounds before a floor exists ...
    min_pilot: int = 4  # ... at least this many, fewer than ``pilot`` when their k^3 factorisations
    pilot_flop: float = 2e9  # would cost more than this (one triangular inverse each at k = 1024 is
    # ~0.4 GFLOP: 4 of them ~ 0.1 s); set by reasoning when the floor was introduced (0045983)
    lag: int = 4  # chunk j is planned from chunks <= j - lag, so results do not depend on thread timing
    # (4 = the most workers); not a cost switch: any value gives the same ranks

    # ---- stage 0 (float32 certificates)
    probe_subsets: int = 1024  # once float32 stopped paying, try it again about every this many subsets:
    # with 16 MB chunks every 256 meant every 4th chunk; cluster pool 2.6 s -> 2.2 s (73ee7f3)
    keep32: float = 0.5  # float32 stays on while it certifies at least this share of a chunk (it costs
    # about half a float64 factorisation, so it pays above one half); by reasoning

    # ---- stage 0b (dependence from the leading rows)
    lead_pad: int = 16  # rows gathered beyond a float32 factorisation's failing pivot (464f148: cluster
    # pool test 4.3 s -> 3.3 s) ...
    lead_pad64: int = 4  # ... beyond float64 pivots found on earlier chunks (73ee7f3, same A/B as above)
    lead_share: float = 0.75  # ... while that stays within this share of k (beyond, gathering the leading
    # block saves little: (m / k)^3 of the factorisation at 0.75 is 0.42); 464f148
    lead_quantile: float = 0.9  # the planner's lead size covers this share of the last chunk's pivots ...
    lead_min_settled: float = 0.3  # ... and runs stage 0b only while at least this share of a chunk was
    # settled at a pivot within it (73ee7f3)

    # ---- stage 1b (dependence proofs)
    ceil_1b_k: int = 384  # from this k on, stage 1b proper also gives proven ceilings (a few
    # matrix-vector products beside a k^3 / 3 factorisation): general position at k = d = 768 with
    # robustness 37.8 s -> 24.5 s on 1000 subsets (4295091)
    dependent_first_floor: float = 2 / 3  # stage 1b first when more than this share of a chunk is
    # dependent at a margin floor (there 1b costs a power iteration plus a factorisation, against one
    # factorisation at the floor) ...
    dependent_first_plain: float = 1 / 2  # ... or this share without a floor (every full-rank subset
    # needs a margin bound anyway) ...
    dependent_first_settled: float = 0.5  # ... and the shortcut settled fewer than this share of them;
    # the three by counting factorisations, not measured

    exact_first_share: float = 0.5  # exact ranks for every subset (no dependence proofs): a chunk goes
    # straight to the exact stages while more than this share of the last chunk was dependent. A
    # dependent subset otherwise pays a failed certificate, a lambda_max bracket and a second
    # certificate (about 4 factorisations) before its eigenvalues (about 4 at k = 768), a full-rank one
    # saves its eigenvalues by its certificate: even near one half. General position (k = d = 768, 1000
    # subsets, every one dependent): 29.6 s -> 16.6 s, each subset's eigenvalues alone 16.1 s (#27)

    ceiling_enough: float = 0.09  # a dependent subset whose ceiling from its Gram matrix is at most this
    # x rtol (just below the default grid's lowest point, 0.1) gets no ceiling from its rows (which reads
    # its k x d rows): at the ViT shape the Gram route's ceilings mostly suffice, and reading the rows of
    # every dependent subset took the cluster pool's default call from 1.17x to 1.28x of the plain test
    # (1000 subsets, one thread, CPU time, load 9-10; #27)
    ceiling_loop_k: int = 160  # from this k on (CPU) the ceilings' kernels run matrix by matrix on views:
    # a batched product with one column runs at ~1.4 GFLOP/s, 7x slower than a matrix-vector product,
    # and gathered copies cost as much again; at k = 197 (54 per chunk) the loop is 1.2x faster, at
    # k = 128 batched is 1.05x faster, at k = 64 2x (micro-benchmark, one thread). General position at
    # k = d = 768, 1000 subsets, one thread: default call 31.5 s -> 27.0 s (plain 21-22 s; #27). Above
    # every k: the batched route, bit for bit the ceilings of the code before it (the loop's differ by
    # the rounding of the refined vectors, about 1e-8 relative either way)

    # ---- the reach (certify at the grid's top multiplier, for probes.robust)
    reach_pays: float = 2.0  # keep certifying at the reach while the subsets so far certified at the
    # floor but not at the reach (one factorisation more each) are at most this many times those
    # certified at the reach (each spares the tolerance analysis a lambda_max bracket and a certificate,
    # about 2.5 factorisations above k = 256, an eigvalsh of about 3 below); was "at most 1 in 8 miss",
    # which turned the reach off on the cluster pool at k = 512 (1 miss in a chunk of 8 subsets):
    # BERT-like shape, cluster pool, 300 subsets, see reports/benchmarks.md (#27)
    reach_dependent: float = 0.75  # ... and while at most this share is dependent (a dependent subset
    # fails at both); session 4 robustness table (1.5x -> 1.22x on the cluster pool at ViT)

    dip_pays: float = 1.0  # stage 1b first at the grid's lowest multiplier (the dip) while the matrices
    # tried there but not proven (a factorisation more each) are at most this many times those proven
    # there (each spares the grid's lowest point a failed certificate and a proof); by counting
    # factorisations; general position (k = d = 768, 300 subsets, one thread) 14.9 s -> 11.6 s (#27)
    # (stage 0b counts too: its subsets dependent at rtol are tried, those it settles with a ceiling
    # below the dip proven; cluster pools at k = 197 / 512: 93 / 49 subsets left for the grid's
    # lowest point -> 12 / 11)
    dip_first_loose: float = 0.5  # with a dip, stage 1b first where the dependence proofs of the last
    # chunk left more than this share of its dependent subsets a ceiling above the dip (general position
    # at k = d: the shortcut's vectors bound most ratios only by about rtol); by counting factorisations

    # ---- the aim (certify near the critical tolerance the robustness analysis will bracket)
    aim_sample: int = 8  # subsets (at least the pilot's; 0: no aim) whose spectra estimate that tolerance; by
    # reasoning: eight eigvalsh at k = 1024 cost about one second of one core, against the 64 spectra the
    # bracket's upper end took before (#25, #27)
    aim_probe: int = 2  # ... of which this many are tried first (the aim is given up on most random pools)
    aim_below: float = 0.08  # certify at (1 - this) x the estimate, so that a bracket from the estimate's
    # ceiling down to the certified level is within robust.FAR_BRACKET_WIDTH (1 / 0.92 = 1.087 <= 1.1)
    aim_over: float = 6.0  # where the sample resolves it, aim at this many times the critical share instead
    # (the subsets that fail the aim get exact spectra or proofs, and the q-th smallest ratio lies among
    # them). MiniLM pretrained tokens, Assumption 3 at threshold 0.99 (q = 51 of 5000 subsets; their 1% to
    # 10% quantiles lie within 9% of each other): 3 left 26 of the needed 51 failing on block.0 (bracket
    # 10.2% wide, bound); 6: 64, 239 and 318 fail on block.0, block.5, embedding, every bracket within 10%
    # (#25)
    aim_hits: int = 3  # the sample holds about this many subsets below the aimed share (at most
    aim_share: float = 0.02  # this share of the subsets: else the sample stays at aim_sample), so that its
    # quantile there is an estimate, not the sample's minimum

    eigen_numpy: bool = True  # float64 eigenvalues on the CPU by NumPy's LAPACK (OpenBLAS) instead of
    # torch's (MKL): 1.5-1.7x faster from k = 512 on, 1.1x at k = 197 on the 2-core AMD EPYC machine (one
    # thread each; :func:`probes.fast.threads.eigvalsh`); general position, exact spectra of 1000
    # subsets at k = d = 768: see reports/benchmarks.md (#27)

    batched_pivots: bool = False  # on the CPU too, the vectors of the stage 1b shortcut for every matrix at
    # once (k x k solves, no host read) instead of per distinct failing pivot on its leading block (fewer
    # flops; off the CPU always batched, see probes.fast.kernels._batched_pivots); for tests of that route

    times_pool: float = 8.0  # the products X_S^T v of the ceilings from the rows as one product with the
    # whole pool (exact zeros outside the subset's rows) while N <= this x m, m the rows per subset: one
    # thread, 32 vectors, against gathering the rows (per vector): 0.05 / 2.31 ms at N = 1000, k = d = 768;
    # 0.15 / 0.98 ms at (2000, 1024, 512); 0.18 / 1.58 ms at (2000, 1280, 1024); equal (0.11 / 0.10 ms)
    # at (2000, 768, 197), N / k = 10 (#27)

    # ---- probes.robust
    expose_pays: float = 0.5  # below rtol, ceilings from the rows for every matrix proven dependent at rtol
    # while the first chunk leaves at most this share of its matrices undecided at the grid point; MiniLM
    # pretrained block.0 queries (k = 128, every subset dependent at rtol, full rank at 0.3x): each
    # exposure failed, 1.6 s of one core per grid point for nothing (#27); by counting factorisations
    eigen_max_k: int = 256  # up to this k, full-rank matrices undecided above rtol get eigenvalues at
    # once: one eigvalsh costs about 3 Cholesky factorisations at k = 197 (5-6 at k = 512-1024 with torch's
    # eigvalsh, about 3 with NumPy's, ``eigen_numpy``) and such a matrix usually takes 3 or more
    # factorisations per grid point (e85b0e8)
    eigen_span: int = 2  # above eigen_max_k, a matrix whose interval holds this many grid points above
    # rtol gets its eigenvalues too, instead of a lambda_max bracket and one or two factorisations per
    # point: grid above rtol, one thread, BERT-like cluster pool (k = 512, 300 subsets) 1.1 s -> 0.83 s,
    # GPT-2-like cluster pool (k = 1024, 200 subsets) 9.9 s -> 9.5 s, a wash there (reports/benchmarks.md,
    # issue 27 third step)


TUNING = Tuning()
