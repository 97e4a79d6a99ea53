"""Capacity sweeps of linear and MLP associative memories (deliverable 1 of capacity lab III).

For every (kind, d, m) and seed, the capacity is the largest N whose memory, trained by the shared
engine, recalls at least ``threshold`` (99%) of ALL its N items. One unit of the sweep is a bucket
(kind, d, m): its seeds run their bisections in lock step, and each round's probes train together as
one ensemble (one :func:`~auditor.lab.engine.train` call per round). This is ``audit assoc``: each
memory kind sweeps into its own folder (``linear/``, ``mlp/``), resumable, and ``capacity.csv``,
``summary.md`` and ``capacity.png`` gather both.

Every row says whether its capacity is ``converged``, by the rule of the factual-recall sweep
(:data:`~auditor.lab.common.search.convergence.PLATEAU_GAIN` over the last
:data:`~auditor.lab.common.search.convergence.PLATEAU_WINDOW` of the step budget): the probes that pass
reached the threshold, so the capacity rests on the first failing probe (N = ``first_fail``), which is
converged when its accuracy had stopped rising (a plateau) and step-limited when it was still climbing at
the step limit. A search that never failed (capacity at the top of the searched range, ``first_fail``
empty) is not converged either: nothing bracketed it. Fits use converged rows only. Each probe of the
``probes`` log carries its own ``plateau_gain`` and ``converged``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from auditor.core.atomic import write_text_atomic
from auditor.core.errors import AuditError, did_you_mean
from auditor.lab.assoc.memories import MEMORY_KINDS, MemoryMember, build_memory, memory_parameters
from auditor.lab.common.search.capacity import GUIDE_CONSTANT, Bisection, invert_n_log_n, search_all
from auditor.lab.common.search.convergence import PLATEAU_GAIN, plateau_gain
from auditor.lab.engine import TrainConfig, train
from auditor.lab.experiment import Experiment, option
from auditor.lab.sweep import write_csv

log = logging.getLogger(__name__)

# the paper's guide lines: params = c * N ln N


@dataclass(frozen=True)
class AssocConfig:
    """A capacity sweep of associative memories.

    ``dims`` are the embedding dimensions d; for the MLP each d runs with every width m = r d for r in
    ``width_ratios``. Each (d, m) is searched for every seed. Training is full batch with the shared
    engine (``optimizer``, ``lr`` with ``schedule`` after ``warmup_frac``), at most ``steps`` updates, stopped
    as soon as ``threshold`` of the items are recalled. The search stops when the capacity is bracketed
    to ``rel_tol`` (relative) or exactly when ``rel_tol = 0``.
    """

    kind: str = "linear"
    dims: tuple[int, ...] = (8, 11, 16, 22, 32, 45)
    width_ratios: tuple[int, ...] = (1,)
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 1024
    lr: float = 1.0
    optimizer: str = "adamw"
    warmup_frac: float = 0.0
    schedule: str = "constant"
    threshold: float = 0.99
    rel_tol: float = 0.02
    eval_every: int = 16

    def __post_init__(self) -> None:
        if self.kind not in MEMORY_KINDS:
            raise did_you_mean("memory kind", self.kind, MEMORY_KINDS)
        if not self.dims or min(self.dims) < 2:
            raise AuditError(f"dims must be a non-empty list of integers >= 2, got {self.dims}")
        if not self.width_ratios or min(self.width_ratios) < 1:
            raise AuditError(f"width ratios m/d must be integers >= 1, got {self.width_ratios}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise AuditError(f"seeds must be a non-empty list of distinct integers, got {self.seeds}")
        if not 0 < self.threshold <= 1:
            raise AuditError(f"threshold must be in (0, 1], got {self.threshold}")
        if not 0 <= self.rel_tol < 1:
            raise AuditError(f"rel_tol must be in [0, 1), got {self.rel_tol}")
        if self.steps < 1 or self.eval_every < 1:
            raise AuditError("steps and eval_every must be >= 1")
        _train_config(dataclasses.asdict(self))  # validates lr, optimizer, warm-up with the engine's checks

    def buckets(self) -> list[dict[str, Any]]:
        """One JSON unit per (d, m): everything a worker needs to run that bucket's searches."""
        widths = self.width_ratios if self.kind == "mlp" else (0,)
        base = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("dims", "width_ratios")}
        base["seeds"] = list(self.seeds)
        return [{**base, "d": d, "m": r * d} for d in self.dims for r in widths]


def _train_config(unit: dict[str, Any]) -> TrainConfig:
    """Full-batch training, frozen once ``threshold`` is reached."""
    return TrainConfig(steps=int(unit["steps"]), lr=float(unit["lr"]), optimizer=unit["optimizer"],
                       warmup_frac=float(unit["warmup_frac"]), schedule=unit["schedule"], early_stop=True,
                       target_accuracy=float(unit["threshold"]), eval_every=int(unit["eval_every"]))


def guide_capacity(kind: str, d: int, m: int = 0) -> float:
    """The N predicted by the paper's guide line params = c N ln N (a starting guess only)."""
    return invert_n_log_n(memory_parameters(kind, d, m) / GUIDE_CONSTANT[kind])


def probe_converged(history: pd.DataFrame, budget: int, passed: bool) -> bool:
    """A probe is converged when it passed (it reached the threshold) or when it failed on a plateau: its
    accuracy rose by less than ``PLATEAU_GAIN`` over the last ``PLATEAU_WINDOW`` of its budget. A failure
    still rising at the step limit is the budget's, not the memory's."""
    return bool(passed) or plateau_gain(history, budget) < PLATEAU_GAIN


def _probe_bucket(
    unit: dict[str, Any], tcfg: TrainConfig, pending: list[tuple[int, int]], log_rows: list
) -> list[bool]:
    """Train one ensemble holding every pending (seed index, N) probe; return pass/fail per probe.
    Each probe is logged with its accuracy, steps, pass, ``plateau_gain`` and ``converged``."""
    seeds = unit["seeds"]
    members = [MemoryMember(n_items=n, seed=seeds[i]) for i, n in pending]
    model, task = build_memory(unit["kind"], unit["d"], members, m=unit["m"])
    result = train(model, task, tcfg, progress=False)
    passed = (result.accuracy >= unit["threshold"] - 1e-9).tolist()
    runs = dict(tuple(result.history.groupby("member")))
    for j, ((i, n), acc, steps, ok) in enumerate(
        zip(pending, result.accuracy.tolist(), result.steps_trained.tolist(), passed)
    ):
        gain = plateau_gain(runs[j], tcfg.steps)
        log_rows.append(
            {
                "seed": seeds[i],
                "n_items": n,
                "accuracy": acc,
                "steps_trained": steps,
                "passed": ok,
                "plateau_gain": round(gain, 6),
                "converged": bool(ok) or gain < PLATEAU_GAIN,
            }
        )
    return passed


def capacity_converged(probes: list[dict[str, Any]], first_fail: int | None) -> bool:
    """Whether a search's capacity is converged: its first failing probe (N = ``first_fail``) exists and
    plateaued. None (the search never failed up to its largest size) is not converged."""
    if first_fail is None:
        return False
    fails = [p for p in probes if p["n_items"] == first_fail and not p["passed"]]
    return bool(fails) and all(p["converged"] for p in fails)


def run_bucket(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Sweep unit: the capacity of every seed of one (kind, d, m) bucket. Returns one row per seed."""
    kind, d, m = unit["kind"], int(unit["d"]), int(unit["m"])
    tcfg = _train_config(unit)
    params = memory_parameters(kind, d, m)
    guess = guide_capacity(kind, d, m)
    max_size = 2 * params
    lo = max(1, min(max_size - 1, math.floor(0.7 * guess)))
    hi = max(lo + 1, min(max_size, math.ceil(1.4 * guess)))
    searches = [Bisection(lo, hi, max_size=max_size, rel_tol=unit["rel_tol"]) for _ in unit["seeds"]]
    probes: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    rounds = search_all(searches, lambda pending: _probe_bucket(unit, tcfg, pending, probes))
    seconds = time.perf_counter() - t0
    rows = []
    for seed, search in zip(unit["seeds"], searches):
        cap = search.capacity
        first_fail = search.hi if search.hi <= max_size else None
        mine = [p for p in probes if p["seed"] == seed]
        rows.append(
            {
                "kind": kind,
                "d": d,
                "width": m,
                "parameters": params,
                "seed": seed,
                "capacity": cap,
                "first_fail": first_fail,
                "converged": capacity_converged(mine, first_fail),
                "n_log_n": cap * math.log(cap) if cap > 1 else 0.0,
                "guide_capacity": round(guess, 2),
                "rounds": rounds,
                "probes": mine,
                "steps": unit["steps"],
                "lr": unit["lr"],
                **{
                    k: unit[k]
                    for k in ("optimizer", "schedule", "warmup_frac", "eval_every", "threshold", "rel_tol")
                },
                "dtype": "float32",
                "seconds": round(seconds, 3),
            }
        )
    return rows


COLUMNS = (
    "kind",
    "d",
    "width",
    "parameters",
    "seed",
    "capacity",
    "first_fail",
    "converged",
    "n_log_n",
    "guide_capacity",
    "rounds",
    "probes",
    "steps",
    "lr",
    "optimizer",
    "schedule",
    "warmup_frac",
    "eval_every",
    "threshold",
    "rel_tol",
    "dtype",
    "seconds",
)


# Named scales per memory kind. The paper: linear AdamW lr 1000 (sic), 4096 full-batch steps, 5 seeds (lr 1
# stored more items here); MLP AdamW lr 3e-2, up to 2^15 full-batch steps, m/d in {1, 2, 4, 8}, d up to 2^6.5.
# reports/assoc/README.md states what the reference scale cut.
PAPER_DIMS = (
    8,
    11,
    16,
    22,
    32,
    45,
    64,
    90,
    128,
    181,
    256,
)  # 2^{3, 3.5, ..., 8}, rounded down as the authors did
PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "linear": {
        "quick": {"dims": (6, 8), "seeds": (0,), "steps": 150, "lr": 1.0, "rel_tol": 0.1},
        "reference": {
            "dims": (8, 11, 16, 23, 32),
            "seeds": (0, 1, 2),
            "steps": 1024,
            "lr": 1.0,
            "rel_tol": 0.02,
        },
        "paper": {"dims": PAPER_DIMS, "seeds": (0, 1, 2, 3, 4), "steps": 4096, "lr": 1.0, "rel_tol": 0.01},
    },
    "mlp": {
        "quick": {
            "dims": (8,),
            "width_ratios": (1,),
            "seeds": (0,),
            "steps": 150,
            "lr": 3e-2,
            "rel_tol": 0.2,
        },
        "reference": {
            "dims": (8, 16),
            "width_ratios": (1, 2, 4),
            "seeds": (0, 1, 2),
            "steps": 1024,
            "lr": 3e-2,
            "rel_tol": 0.03,
        },
        "paper": {
            "dims": PAPER_DIMS[:8],
            "width_ratios": (1, 2, 4, 8),
            "seeds": (0, 1, 2, 3, 4),
            "steps": 2**15,
            "lr": 3e-2,
            "rel_tol": 0.01,
        },
    },
}


@dataclass(frozen=True)
class AssocSweep:
    """What ``audit assoc`` runs: the memories, and the fields that replace their scale's values."""

    memory: str = option("both", "Which associative memory to measure.", choices=("linear", "mlp", "both"))
    dims: tuple[int, ...] | None = option(None, "Embedding dimensions d.", default_help="per scale")
    width_ratios: tuple[int, ...] | None = option(
        None, "MLP widths m/d (MLP only).", default_help="per scale"
    )
    seeds: tuple[int, ...] | None = option(None, "Seeds of the searches.", default_help="per scale")
    steps: int | None = option(None, "Max training steps per probe.", default_help="per scale")
    lr: float | None = option(None, "Learning rate.", parse="floats", default_help="per scale")
    rel_tol: float | None = option(None, "Stop the bisection at this relative bracket (0 = exact).",
                                   default_help="per scale")
    scale: str = "reference"

    def __post_init__(self) -> None:
        self.configs()  # validates every value against each memory

    def configs(self) -> list[AssocConfig]:
        given = {k: getattr(self, k) for k in ("dims", "width_ratios", "seeds", "steps", "lr", "rel_tol")
                 if getattr(self, k) is not None}
        kinds = ["linear", "mlp"] if self.memory == "both" else [self.memory]
        return [AssocConfig(kind=kind, **{**PRESETS[kind][self.scale], **given}) for kind in kinds]


def _report(frame: pd.DataFrame, out: Path, config: AssocSweep) -> str:
    from auditor.lab.common.search.summary import capacity_markdown

    write_csv(frame, out / "capacity.csv")
    text = capacity_markdown(frame)
    write_text_atomic(out / "summary.md", text + "\n")
    return text + f"\n\nwrote {out / 'capacity.csv'}, {out / 'summary.md'}"


def _plots(frame: pd.DataFrame, out: Path, config: AssocSweep) -> list[Path]:
    from auditor.lab.common.search.plots import plot_capacity

    return [plot_capacity(frame, out / "capacity.png")]


EXPERIMENT = Experiment(
    name="assoc",
    help="Capacity of linear and MLP associative memories: the largest N stored at 99% accuracy "
    "over all N items "
    "(bisection), swept over d (and m/d), with scaling-law fits against d^2 = 1.3 N ln N "
    "and m d = 0.35 N ln N.",
    examples="audit assoc --out runs/assoc                 # reference scale, "
    "both memories (~3 CPU minutes)\n"
    "audit assoc --memory linear --dims 8,16,32   # a custom sweep\n"
    "audit assoc --scale paper                    # the paper's sizes, steps and seeds",
    config=AssocSweep,
    units=lambda config, out: [unit for c in config.configs() for unit in c.buckets()],
    run_unit=run_bucket,
    columns=COLUMNS,
    plots=_plots,
    report=_report,
    scale_names=("quick", "reference", "paper"),
    folder=lambda unit: unit["kind"],
    key_defaults=AssocConfig,  # a unit holds an AssocConfig's fields: its key leaves their defaults out
)
