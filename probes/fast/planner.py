"""What each chunk of a k-subset test does, planned from the chunks decided before it.

A plan never changes a rank, a verdict or a witness: it chooses the margin floor, whether stage 0
(float32) runs, whether stage 1b goes first, whether the test certifies at the robustness grid's top
multiplier (the reach), whether stage 1b proves at the grid's lowest multiplier first (the dip) and
whether stage 0b gathers only the leading rows. The thresholds are fields
of :class:`probes.fast.tuning.Tuning`. Chunk j is planned from chunks 0 .. j - ``lag`` only, so that
plans, and hence stage counts and margin bounds, do not depend on thread timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from probes.fast.tuning import Tuning


@dataclass
class Plan:
    """What one chunk does (see the module docstring)."""

    floor: float | None  # margin floor (None: margin bounds for every certified subset)
    use32: bool  # stage 0 runs
    dependent_first: bool  # stage 1b before stage 1
    reach: float | None = None  # certify at this margin first (see :func:`probes.fast.decide`)
    lead: int | None = None  # stage 0b on this many leading rows, without stage 0 (Pool.dependent_lead)
    dip: float | None = None  # stage 1b at this multiplier of rtol first (see :func:`probes.fast.decide`)


@dataclass
class Chunk:
    """A decided chunk: its ranks, margins and stage counts, and what the plan of later chunks needs."""

    rank: torch.Tensor
    margin: torch.Tensor
    stages: dict[str, int]
    min_margin: float  # over subsets with a known rank (inf if none)
    bound: torch.Tensor  # (c,) bool: the margin is a certified lower bound
    tried32: bool
    rate32: float  # share certified by stage 0 (when tried)
    dependent_share: float  # share dependent (proven by stage 1b, or of exact rank < k)
    shortcut: int  # how many of those the stage 1b shortcut settled
    ceiling: torch.Tensor | None = None  # (c,) see :class:`probes.fast.Decisions`
    reach_miss: float | None = None  # with a reach: share certified at the floor but not at the reach
    reach_hit: float | None = None  # ... and share certified at the reach
    fail_at: torch.Tensor | None = None  # (c,) 1-based failing pivots of the subsets the shortcut settled
    # (0 elsewhere)
    floor: torch.Tensor | None = None  # (c,) see :class:`probes.fast.Decisions`
    dip_tried: int = 0  # see :class:`probes.fast.Decisions`
    dip_proven: int = 0
    dip_loose: float = 0.0  # with a dip: share of the subsets proven dependent whose ceiling lies above it


class Planner:
    """The plan of chunk j from the chunks 0 .. j - lag (the pilot chunks are always among them).
    Running minima are kept per chunk, so plans do not depend on the order they are asked for."""

    def __init__(self, n_pilot: int, can32: bool, prove: bool, probe: int, tuning: Tuning,
                 reach: float | None = None, lead_k: int | None = None, dip: float | None = None):
        self.n_pilot, self.can32, self.prove, self.probe = n_pilot, can32, prove, probe
        self.tuning, self.reach, self.dip = tuning, reach, dip
        self.lead_k = lead_k  # k where stage 0b may run (with dependence proofs), else None
        self.floors: list[float] = []  # smallest margin over chunks 0 .. i
        self.tried: list[Chunk | None] = []  # the last chunk <= i that ran stage 0
        self.reached: list[tuple[float, float] | None] = []  # (misses, hits) at the reach, summed over the
        # chunks <= i that certified at it (None before the first)
        self.dipped: list[tuple[int, int]] = []  # (tried, proven) at the dip over chunks 0 .. i

    def __call__(self, j: int, done: list) -> Plan:
        top = max(self.n_pilot, j - self.tuning.lag + 1) - 1  # the last chunk this plan may look at
        while len(self.floors) <= top:
            i = len(self.floors)
            ch = done[i]
            self.floors.append(min(self.floors[-1], ch.min_margin) if i else ch.min_margin)
            self.tried.append(ch if ch.tried32 else (self.tried[-1] if i else None))
            self.reached.append(self._sum_reach(self.reached[-1] if i else None, ch))
            tried, proven = self.dipped[-1] if i else (0, 0)
            self.dipped.append((tried + ch.dip_tried, proven + ch.dip_proven))
        last = done[top]
        floor = self.floors[top] if math.isfinite(self.floors[top]) else None
        probing = (j - self.n_pilot) % self.probe == 0  # every ``probe``-th chunk retries what stopped paying
        use32 = self.can32 and floor is not None and self._float32_pays(top, probing)
        dip = self._dip(top, probing)
        return Plan(floor=floor, use32=use32, dependent_first=self._dependent_first(last, floor, dip),
                    reach=self._reach(top, last, floor, probing), lead=self._lead(last, use32), dip=dip)

    def _float32_pays(self, top: int, probing: bool) -> bool:
        """Float32 until a chunk shows that it certifies less than ``keep32`` of the chunk, then while it
        certifies that much of the last chunk that tried it; otherwise on probing chunks only."""
        tried = self.tried[top]
        return tried is None or tried.rate32 >= self.tuning.keep32 or probing

    def _dependent_first(self, last: Chunk, floor: float | None, dip: float | None) -> bool:
        """Stage 1b first pays when most subsets are dependent and its shortcut (after a failed stage 1
        factorisation) does not settle them (thresholds: ``Tuning.dependent_first_*``); with a dip, also
        where it does but leaves most of them a ceiling above the dip (``Tuning.dip_first_loose``: the
        grid's lowest point would prove them again; stage 1b at the dip proves both at once). Without
        dependence proofs (exact ranks for every subset), the exact stages first while more than
        ``Tuning.exact_first_share`` of the last chunk was dependent."""
        t = self.tuning
        if not self.prove:  # exact ranks for every subset: the exact stages first where most are dependent
            return last.dependent_share > t.exact_first_share
        share = t.dependent_first_floor if floor is not None else t.dependent_first_plain
        settled = last.shortcut / max(1, last.stages["cholesky_dependent"])
        loose = dip is not None and last.dip_loose > t.dip_first_loose
        return self.prove and last.dependent_share > share and (loose or settled < t.dependent_first_settled)

    @staticmethod
    def _sum_reach(before: tuple[float, float] | None, ch: Chunk) -> tuple[float, float] | None:
        """Running (misses, hits) at the reach, in subsets (a chunk of a few subsets says little alone)."""
        if ch.reach_miss is None:
            return before
        c = ch.rank.numel()
        miss, hit = before if before is not None else (0.0, 0.0)
        return miss + ch.reach_miss * c, hit + ch.reach_hit * c

    def _reach(self, top: int, last: Chunk, floor: float | None, probing: bool) -> float | None:
        """The reach while it pays over the chunks so far (else on probing chunks only): a subset
        certified at the floor but not at the reach costs one factorisation more, one certified at the
        reach spares the tolerance analysis about ``reach_pays`` of them; and while few are dependent
        (a dependent subset fails at both)."""
        t = self.tuning
        if self.reach is None or floor is None or not self.reach > floor:
            return None
        if last.dependent_share >= t.reach_dependent:
            return None
        reached = self.reached[top]
        if reached is None or probing or reached[0] <= t.reach_pays * reached[1]:
            return self.reach
        return None

    def _dip(self, top: int, probing: bool) -> float | None:
        """The dip while it pays over the chunks so far (else on probing chunks only): a matrix tried
        at the dip but not proven there costs one factorisation more (stage 1b at rtol after it), one
        proven there spares the grid's lowest point a certificate and a proof, about ``dip_pays``
        factorisations."""
        if self.dip is None:
            return None
        tried, proven = self.dipped[top]
        if probing or (tried - proven) <= self.tuning.dip_pays * proven:
            return self.dip
        return None

    def _lead(self, last: Chunk, use32: bool) -> int | None:
        """Stage 0b without stage 0: while enough subsets of a chunk are settled by the shortcut at a
        pivot within ``lead_share`` k (their proof then reads about (m / k)^2 of the block and factorises
        (m / k)^3 of it; the others pay the m x m gather and factorisation once more)."""
        t = self.tuning
        if self.lead_k is None or use32 or last.fail_at is None:
            return None
        at = last.fail_at[last.fail_at > 0]
        if not at.numel():
            return None
        at = at.sort().values
        # ``lead_quantile`` of them within m rows (integer arithmetic: 0.9 -> 9 (n - 1) // 10)
        m = int(at[round(t.lead_quantile * 1000) * (at.numel() - 1) // 1000]) + t.lead_pad64
        settled = int((at + t.lead_pad64 <= m).sum())
        if m <= t.lead_share * self.lead_k and settled >= t.lead_min_settled * last.rank.numel():
            return m
        return None
