"""k-subsets of a pool: chunks of subsets, each planned from the chunks before it (:mod:`.planner`),
gathered and decided by stages 0 and 0b (:mod:`.pool`) and then stages 1 to 3 (:func:`.stages.decide`),
on worker threads (:mod:`.threads`). Results do not depend on the chunking or the number of threads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from probes.fast import tuning as tuning_module
from probes.fast.errors import lam_hi_bound
from probes.fast.kernels import power_lower
from probes.fast.planner import Chunk, Plan, Planner
from probes.fast.pool import Pool
from probes.fast.stages import STAGE_KEYS, Decisions, decide, exact_stage, floor_certificate, read_counts
from probes.fast.threads import map_chunks, run_chunks
from probes.fast.tuning import Tuning


def subset_step(k: int, tuning: Tuning | None = None, device: torch.device | str | None = None) -> int:
    """Subsets per chunk: ``cache_bytes`` of float64 k x k blocks, at most ``max_chunk``; off the CPU
    (``device`` given and not the CPU) ``device_bytes``, at most ``device_max_chunk``."""
    t = tuning_module.TUNING if tuning is None else tuning
    if device is not None and torch.device(device).type != "cpu":
        return max(1, min(t.device_max_chunk, t.device_bytes // (8 * k * k)))
    return max(1, min(t.max_chunk, t.cache_bytes // (8 * k * k)))


@dataclass
class _Job:
    """What every chunk of one :func:`subset_decisions` call shares."""

    pool: Pool
    subsets: torch.Tensor  # (S, k)
    rtol: float
    prove: bool  # dependence proofs (exact ranks only for the first ``first`` dependent subsets)
    ceilings: bool
    first: int  # subsets 0 .. first - 1 get exact ranks where dependent, without a proof first
    tuning: Tuning
    dip: float | None = None  # see :func:`probes.fast.decide`
    aim: float | None = None  # see :func:`subset_decisions`


def _settle(out: Decisions, decided: torch.Tensor, pos: torch.Tensor, dep: torch.Tensor, at: torch.Tensor,
            ceil: torch.Tensor) -> None:
    """Record the subsets at ``pos[dep]`` as proven dependent by stage 0b (the shortcut's outcome)."""
    pos = pos[dep]
    out.rank[pos] = -1
    out.margin[pos] = math.nan
    out.fail_at[pos] = at[dep]
    if out.ceiling is not None:
        out.ceiling[pos] = ceil[dep]
    decided[pos] = True
    out.stages["cholesky_dependent"] += int(pos.numel())
    out.shortcut += int(pos.numel())


def _stage0(job: _Job, idx: torch.Tensor, plan: Plan, first: int, out: Decisions,
            decided: torch.Tensor) -> tuple[float, torch.Tensor | None, bool]:
    """Stages 0 and 0b of a chunk, into ``out``; returns the share stage 0 certified, the positions
    stage 0b tried at the dip (None: none), and whether either ran (else ``decided`` is still all False,
    known without reading it from the device)."""
    c, k = idx.shape
    lead = job.prove and job.pool.numpy
    dip = plan.dip if job.ceilings else None
    if plan.use32:
        at = plan.reach if plan.reach is not None else plan.floor
        if lead:
            ok, info32, gersh_up = job.pool.certify32(idx, at, detail=True)
        else:
            ok = job.pool.certify32(idx, at)
        out.margin[ok] = at
        out.bound[ok] = True
        decided |= ok
        out.stages["cholesky32"] = int(ok.sum())
        if lead:  # rows up to the float32 factorisation's failing pivot, and a few more
            need = info32.to(torch.int64) + job.tuning.lead_pad
            cand = ~ok & (info32 > 0) & (need <= job.tuning.lead_share * k)
            cand[:first] = False  # (those get exact ranks)
            if bool(cand.any()):
                pos = cand.nonzero().flatten()
                lead_of = job.pool.dependent_lead(idx[pos], int(need[pos].max()), gersh_up[pos], job.ceilings,
                                                  dip=dip)
                _settle(out, decided, pos, *lead_of)
                return out.stages["cholesky32"] / c, pos if dip is not None else None, True
        return out.stages["cholesky32"] / c, None, True
    if lead and plan.lead is not None and first < c:
        pos = torch.arange(first, c, device=idx.device)
        _settle(out, decided, pos, *job.pool.dependent_lead(idx[pos], plan.lead, None, job.ceilings, dip=dip))
        return 0.0, pos if dip is not None else None, True
    return 0.0, None, False


def _stages_1_to_3(job: _Job, idx: torch.Tensor, plan: Plan, first: int, out: Decisions,
                   decided: torch.Tensor | None) -> Decisions:
    """Stages 1 to 3 on the subsets stages 0 and 0b left (``decided``; None: none decided), merged into
    ``out`` (returned: a new object where nothing was decided before)."""
    c = idx.shape[0]
    todo = (~decided).nonzero().flatten() if decided is not None and bool(decided.any()) else None
    if todo is not None and not todo.numel():
        return out
    sub = idx if todo is None else idx[todo]
    early = None
    if job.prove and first > 0:
        early = torch.arange(c, device=idx.device) < first
        early = early if todo is None else early[todo]
    dec = decide(job.pool.gram64(sub), job.pool.rows_of(sub), job.rtol, job.pool.d,
                 lam_cap=job.pool.lam_cap, exact_dependent=0 if job.prove else None,
                 dependent_first=plan.dependent_first, floor=plan.floor, reach=plan.reach,
                 ceilings=job.ceilings, exact_first=early, dip=plan.dip, defer_counts=True)
    if todo is None:
        dec.stages = {key: out.stages[key] + value for key, value in dec.stages.items()}
        dec.shortcut += out.shortcut
        return dec
    out.rank[todo], out.margin[todo], out.bound[todo] = dec.rank, dec.margin, dec.bound
    out.fail_at[todo] = dec.fail_at
    if out.ceiling is not None:
        out.ceiling[todo], out.floor[todo] = dec.ceiling, dec.floor
    for key, value in dec.stages.items():
        out.stages[key] += value
    out.shortcut += dec.shortcut
    out.dip_tried, out.dip_proven = dec.dip_tried, dec.dip_proven
    return out


def decide_chunk(job: _Job, a: int, b: int, plan: Plan) -> Chunk:
    """Stages 0, 0b, 1, 1b, 2, 3 for the subsets a .. b - 1; stage 1b leaves rank -1."""
    idx = job.subsets[a:b]
    c, k = idx.shape
    first = max(0, min(b, job.first) - a)
    out = Decisions.empty(c, k, idx.device, ceilings=job.ceilings)
    decided = torch.zeros(c, dtype=torch.bool, device=idx.device)
    rate32, dipped, ran0 = _stage0(job, idx, plan, first, out, decided)
    out = _stages_1_to_3(job, idx, plan, first, out, decided if ran0 else None)  # (stage 0b at ``dipped``)
    rank, margin, bound = out.rank, out.margin, out.bound
    if dipped is not None:  # stage 0b at the dip: tried on the subsets dependent at rtol, proven below it
        tried = dipped[rank[dipped] != k]
        out.dip_tried += int(tried.numel())
        out.dip_proven += int((decided[tried] & (out.ceiling[tried] <= job.rtol * plan.dip)).sum())
    # what the plans of later chunks read, in one read from the device: the smallest known margin (inf
    # if none), the dependent count, and those proven dependent with ceilings above the dip, those
    # certified below and at the reach
    known = (rank >= 0) & ~margin.isnan()
    proven = rank == -1
    certified = bound & (rank == k)
    zero = torch.zeros((), dtype=torch.float64, device=rank.device)
    dipped_job = job.dip is not None and out.ceiling is not None
    loose = ((out.ceiling > job.rtol * job.dip) & proven).sum() if dipped_job else zero
    below = (certified & (margin < plan.reach)).sum() if plan.reach is not None else zero
    at_reach = (certified & (margin >= plan.reach)).sum() if plan.reach is not None else zero
    # (the floor: not from a dependent subset's margin bound, which lies below its exact margin)
    floor_from = known & ~(bound & (rank != k))
    min_margin, dependent, proven_count, loose, below, at_reach = read_counts(out, [
        torch.where(floor_from, margin, math.inf).amin(), (rank != k).sum(), proven.sum(), loose, below,
        at_reach])
    return Chunk(rank=rank, margin=margin, stages=out.stages, bound=bound, min_margin=min_margin,
                 tried32=plan.use32, rate32=rate32, dependent_share=dependent / c, shortcut=out.shortcut,
                 ceiling=out.ceiling, reach_miss=below / c if plan.reach is not None else None,
                 reach_hit=at_reach / c if plan.reach is not None else None, fail_at=out.fail_at,
                 floor=out.floor, dip_tried=out.dip_tried, dip_proven=out.dip_proven,
                 dip_loose=loose / max(1.0, proven_count) if dipped_job else 0.0)


def _chunk_bounds(s: int, k: int, step: int, t: Tuning) -> tuple[list[tuple[int, int]], int]:
    """(a, b) subset ranges of the chunks, and how many of them are pilot chunks: the first subsets get
    margin bounds each (no floor yet), ``pilot`` of them, fewer for large k."""
    pilot = min(s, max(t.min_pilot, min(t.pilot, int(t.pilot_flop / k**3))))
    bounds = [(a, min(a + step, pilot)) for a in range(0, pilot, step)]
    n_pilot = len(bounds)
    return bounds + [(a, min(a + step, s)) for a in range(pilot, s, step)], n_pilot


def _worker_count(workers: int | None, device: torch.device, flop: float, t: Tuning) -> int:
    """Threads for the chunks: as asked (CPU), else up to ``max_workers`` torch threads when the work
    is large enough; one off the CPU."""
    if device.type != "cpu":
        return 1
    if workers is None:
        return min(t.max_workers, torch.get_num_threads()) if flop >= t.min_parallel_flop else 1
    return max(1, workers)


def _certifies(job: _Job, idx: torch.Tensor, margin: float) -> torch.Tensor:
    """(c,) bool: the float64 certificate of the chunks proves the subsets ``idx`` (c <= the pool's step)
    full rank with this margin."""
    gram = job.pool.gram64(idx)
    return floor_certificate(gram, lam_hi_bound(gram, job.pool.lam_cap, quick=True), job.rtol, job.pool.d,
                             margin)[0]


def _aimed_margin(job: _Job, sample: Decisions, reach: float | None) -> float | None:
    """The margin the aim certifies at, from the spectra of the subsets 0 .. m - 1 (``sample``): where the
    sample resolves :func:`_aim_over`'s share, the level about that share of it cannot be certified at;
    else ``1 - Tuning.aim_below`` of the ratio at the critical quantile. None where it would not pay: the
    critical tolerance estimated among dependent subsets or not beyond the reach, or the float64
    certificate at it failing on a sample subset whose level lies clearly above it."""
    k, m, t = job.subsets.shape[1], sample.rank.numel(), job.tuning
    full = sample.rank == k
    if not bool(full.any()) or float((~full).double().mean()) > job.aim:
        return None
    level = sample.floor.cpu()  # (a dependent subset's floor is 0)
    over = _aim_over(job)
    if over * m >= t.aim_hits:
        # the sample resolves a share above the critical one: aim where about that share fails the
        # certificate, whose bound on lambda_max sets the ratio each subset can be certified at
        level = level * _slack(job, m)
        target = float(torch.quantile(level, over))
    else:
        target = float(torch.quantile(level, job.aim)) * (1 - t.aim_below)
    if not target > job.rtol:
        return None
    margin = math.log10(target / job.rtol)
    if reach is not None and not margin > reach:
        return None
    # the certificate must pass on the sample's subsets clearly above the aim (else its bound on
    # lambda_max is too loose for the aim to pay)
    idx, step = job.subsets[:m][full & (level >= target * (1 + t.aim_below)).to(full.device)], job.pool.step
    if idx.shape[0] and all(bool(_certifies(job, idx[a : a + step], margin).all())
                            for a in range(0, idx.shape[0], step)):
        return margin
    return None


def _slack(job: _Job, m: int) -> torch.Tensor:
    """(m,) sqrt(lambda_max estimate / the certificate's bound on it) for the subsets 0 .. m - 1: the
    share of its ratio at which the certificate can prove a subset full rank (about)."""
    step, out = job.pool.step, []
    for a in range(0, m, step):
        gram = job.pool.gram64(job.subsets[a : min(a + step, m)])
        lam_hi = lam_hi_bound(gram, job.pool.lam_cap, quick=True)
        out.append((power_lower(gram, 8) / lam_hi).clamp(max=1).sqrt().cpu())
    return torch.cat(out)


def _aim_over(job: _Job) -> float:
    """The share of subsets the aim lets fail where the sample resolves it: ``Tuning.aim_over`` times the
    critical share."""
    return min(1.0, job.tuning.aim_over * job.aim) if job.aim else 0.0


def _aim_size(job: _Job, pilot: int) -> int:
    """The aim's sample: ``Tuning.aim_sample`` subsets (at least the pilot's), or as many as hold about
    ``Tuning.aim_hits`` below the share :func:`_aim_over` where that is at most ``Tuning.aim_share`` of
    the subsets (a larger sample that cannot resolve it would be spectra for nothing)."""
    s, t = job.subsets.shape[0], job.tuning
    over = _aim_over(job)
    want = math.ceil(t.aim_hits / over) if over > 0 else s + 1
    return min(s, max(pilot, t.aim_sample, want if want <= t.aim_share * s else 0))


def _aim(job: _Job, pilot: list[Chunk], reach: float | None, workers: int
         ) -> tuple[float | None, Decisions | None]:
    """The reach aimed at the critical tolerance (see ``aim`` in :func:`subset_decisions`) and the
    sample's spectra (a :class:`Decisions` of the first subsets), or (None, None).

    Skipped when the pilot chunks hold more dependent subsets than the aimed share (then the critical
    tolerance lies among the dependent subsets, below rtol, where certificates do not reach). Given up
    when the float64 certificate at the aimed margin fails on a full-rank subset of the sample: its
    bound on lambda_max (row sums, the pool's sigma_1^2) then lies too far above lambda_max (random
    Gaussian pools), and a lower aim would only give every subset the same loose lower end. The first
    ``Tuning.aim_probe`` subsets are tried alone first, so that such pools pay for a few spectra only."""
    rank = torch.cat([ch.rank for ch in pilot])
    k, t = job.subsets.shape[1], job.tuning
    if t.aim_sample <= 0 or float((rank != k).double().mean()) > job.aim:
        return None, None
    m = _aim_size(job, rank.numel())
    device = job.subsets.device

    def spectra(a: int, b: int) -> Decisions:
        step = min(job.pool.step, -(-(b - a) // max(1, workers)))  # (the pool's buffers hold ``step`` blocks)
        return _spectra(job, torch.arange(a, b, device=device), step, workers)

    probe = min(m, t.aim_probe)
    sample = spectra(0, probe)
    if _aimed_margin(job, sample, reach) is None:
        return None, None
    if probe < m:
        sample = _cat_decisions([sample, spectra(probe, m)])
    margin = _aimed_margin(job, sample, reach)
    return (margin, sample) if margin is not None else (None, None)


def _run(job: _Job, bounds: list[tuple[int, int]], n_pilot: int, planner: Planner, workers: int,
         on_chunk: Callable[[int], None] | None) -> tuple[list[Chunk], Decisions | None]:
    """Every chunk, the pilot chunks first in the calling thread, the others planned by ``planner``;
    and the aim's sample (or None)."""
    chunks: list = []
    for j in range(n_pilot):
        chunks.append(decide_chunk(job, *bounds[j], Plan(floor=None, use32=False, dependent_first=False)))
        if on_chunk is not None:
            on_chunk(bounds[j][1] - bounds[j][0])
    sample = None
    if job.aim is not None and job.ceilings:
        reach, sample = _aim(job, chunks, planner.reach, workers)
        if reach is not None:
            planner.reach = reach
    rest = len(bounds) - n_pilot
    if min(workers, rest) > 1:
        run_chunks(bounds, chunks, lambda j, plan: decide_chunk(job, *bounds[j], plan), planner,
                   min(workers, rest), on_chunk, job.tuning.lag)
        return chunks, sample
    for j in range(n_pilot, len(bounds)):
        chunks.append(decide_chunk(job, *bounds[j], planner(j, chunks)))
        if on_chunk is not None:
            on_chunk(bounds[j][1] - bounds[j][0])
    return chunks, sample


def _spectra(job: _Job, chosen: torch.Tensor, step: int, workers: int) -> Decisions:
    """Exact ranks and margins of the subsets at ``chosen`` from their spectra (stages 2 and 3), with
    proven floors and ceilings of sigma_k / sigma_1; chunks of ``step`` on ``workers`` threads."""
    k = job.subsets.shape[1]
    pieces = [(a, min(a + step, chosen.numel())) for a in range(0, chosen.numel(), step)]
    device = job.pool.x.device

    def exact(j: int) -> Decisions:
        sub = job.subsets[chosen[pieces[j][0] : pieces[j][1]]]
        gram = job.pool.gram64(sub)
        part = Decisions.empty(sub.shape[0], k, device, ceilings=True)
        exact_stage(gram, torch.arange(sub.shape[0], device=device), lambda p: job.pool.rows(sub[p]),
                    lam_hi_bound(gram, job.pool.lam_cap), job.rtol, job.pool.d, part)
        return part

    parts = map_chunks(exact, len(pieces), workers)
    return _cat_decisions(parts) if parts else Decisions.empty(0, k, device, ceilings=True)


def _cat_decisions(parts: list[Decisions]) -> Decisions:
    """Exact-stage decisions of consecutive subsets, in one (ranks, margins, floors, ceilings)."""
    return Decisions(torch.cat([p.rank for p in parts]), torch.cat([p.margin for p in parts]),
                     {key: sum(p.stages[key] for p in parts) for key in STAGE_KEYS},
                     bound=torch.cat([p.bound for p in parts]), ceiling=torch.cat([p.ceiling for p in parts]),
                     floor=torch.cat([p.floor for p in parts]))


def _exact_histogram(job: _Job, out: Decisions, exact_dependent: int, step: int, workers: int) -> None:
    """Exact ranks for the first ``exact_dependent`` dependent subsets, in subset order: those among
    subsets 0 .. exact_dependent - 1 got them without a dependence proof (they cannot fall beyond that
    budget); the others proven dependent get them now."""
    k = job.subsets.shape[1]
    order = (out.rank != k).nonzero().flatten()[:exact_dependent]
    chosen = order[out.rank[order] == -1]
    if not chosen.numel():
        return
    part = _spectra(job, chosen, step, workers)
    out.rank[chosen], out.margin[chosen] = part.rank, part.margin
    out.bound[chosen] = part.bound
    if out.ceiling is not None:
        out.ceiling[chosen], out.floor[chosen] = part.ceiling, part.floor
    for key, value in part.stages.items():
        out.stages[key] += value


def _merge_sample(out: Decisions, sample: Decisions) -> None:
    """The aim's sample (the first subsets) adds the proven floors and ceilings of its spectra; ranks,
    margins and stage counts stay the test's own."""
    m = sample.rank.numel()
    out.floor[:m] = torch.maximum(out.floor[:m], sample.floor)
    out.ceiling[:m] = torch.minimum(out.ceiling[:m], sample.ceiling)


def subset_decisions(
    vectors64: torch.Tensor,
    subsets: torch.Tensor,
    rtol: float,
    pool_gram: torch.Tensor | None,
    *,
    lam_cap: float | None = None,
    exact_dependent: int | None = None,
    on_chunk: Callable[[int], None] | None = None,
    workers: int | None = None,
    reach: float | None = None,
    ceilings: bool = False,
    dip: float | None = None,
    aim: float | None = None,
) -> Decisions:
    """Decide every k-subset of a pool.

    Args:
        vectors64: (N, d) float64 pool.
        subsets: (S, k) int64 row indices (on the pool's device).
        pool_gram: (N, N) float64 Gram of the whole pool, or None to form each subset's Gram by bmm.
        lam_cap: sigma_1^2 of the pool (bounds every subset's lambda_max), or None.
        exact_dependent: see :func:`probes.fast.decide`; the first this many dependent subsets (in
            subset order) get exact ranks, beside those the fast path decides exactly anyway. Subsets
            among the first this many that fail their certificate go straight to the exact stages (they
            would get an exact rank after their proof in any case).
        on_chunk: called with the number of subsets after each chunk is decided (progress), or None.
        workers: threads for the chunks (CPU); None: up to ``torch.get_num_threads()`` when the work is
            large enough. Results do not depend on it.
        reach, ceilings: see :func:`probes.fast.decide` (for :mod:`probes.robust`; ranks do not depend
            on them). The reach is given up while it does not pay (``Tuning.reach_pays``) or more than
            ``Tuning.reach_dependent`` of a chunk are dependent.
        dip: see :func:`probes.fast.decide`; given up while it does not pay (``Tuning.dip_pays``).
        aim: with ceilings, the quantile (in [0, 1]) of sigma_k / sigma_1 over the subsets at which the
            tolerance analysis will look for the critical tolerance. After the pilot chunks, the exact
            spectra of the first subsets (``Tuning.aim_sample``, at least the pilot's, or more where
            that resolves ``Tuning.aim_over`` times the quantile, see :func:`_aim_size`) estimate it;
            where the estimate lies above the reach, the reach becomes that level: the ratio at which
            about ``aim_over`` times the quantile's share of the sample fails the certificate where the
            sample resolves it (the q-th smallest ratio then lies among the subsets that fail, which
            the analysis decomposes), else ``1 - Tuning.aim_below`` of the estimate (the sample's
            spectra give the upper end: their floors and ceilings join ``floor`` and ``ceiling``).
            Ranks do not depend on it.

    Returns:
        :class:`Decisions`; certified margins are lower bounds (the margin floor, see
        :mod:`probes.fast`), and their minimum over known ranks is a proven lower bound on the smallest
        margin.
    """
    s, k = subsets.shape
    t = tuning_module.TUNING
    step = subset_step(k, t, vectors64.device)
    pool = Pool(vectors64, pool_gram, k, rtol, lam_cap, step)
    prove = exact_dependent is not None and k > 1
    if s == 0:
        out = Decisions.empty(0, k, vectors64.device, ceilings=ceilings)
        out.fail_at = None
        return out
    dip = dip if prove and ceilings and dip is not None and 0 < dip < 1 else None
    job = _Job(pool, subsets, rtol, prove, ceilings, exact_dependent if prove and exact_dependent else 0, t,
               dip, aim if ceilings and aim is not None and 0 <= aim <= 1 else None)
    bounds, n_pilot = _chunk_bounds(s, k, step, t)
    probe = max(1, t.probe_subsets // step)  # chunks between retries of what stopped paying
    planner = Planner(n_pilot, pool.can32, prove, probe, t, reach, k if prove and pool.numpy else None, dip)
    pilot = bounds[n_pilot - 1][1]
    workers = _worker_count(workers, vectors64.device, (s - pilot) * k * k * (k + 16), t)
    chunks, sample = _run(job, bounds, n_pilot, planner, workers, on_chunk)
    out = Decisions(torch.cat([ch.rank for ch in chunks]), torch.cat([ch.margin for ch in chunks]),
                    {key: sum(ch.stages[key] for ch in chunks) for key in STAGE_KEYS},
                    sum(ch.shortcut for ch in chunks), torch.cat([ch.bound for ch in chunks]),
                    torch.cat([ch.ceiling for ch in chunks]) if ceilings else None,
                    floor=torch.cat([ch.floor for ch in chunks]) if ceilings else None,
                    dip_tried=sum(ch.dip_tried for ch in chunks),
                    dip_proven=sum(ch.dip_proven for ch in chunks))
    if sample is not None:
        _merge_sample(out, sample)
    if prove and exact_dependent:
        _exact_histogram(job, out, exact_dependent, step, workers)
    return out
