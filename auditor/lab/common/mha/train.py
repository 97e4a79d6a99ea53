"""Memorization sweeps over H, n, d_h, N and seeds, trained as batched buckets on the shared engine.

A sweep is a list of :class:`MemorizeRun` (one layer on one dataset). Compatible runs (same d, task,
label width, context sharing and variant) are sorted by cost and cut into buckets of ``bucket_size``
members; one bucket = one :func:`~auditor.lab.sweep.run_sweep` unit = one :func:`~auditor.lab.engine.train`
call, so a sweep resumes at bucket granularity (and inside a bucket from the engine's checkpoint).

Training runs to convergence, not to a budget (:func:`train_rounds`): round 1 is a warm-up + cosine
cycle of ``steps`` steps; a member that has not memorized every example trains another cycle from its
weights (fresh optimiser state), and stops when a round adds at most ``plateau`` x N memorized
examples. ``stop_reason`` says which: ``all_memorized`` or ``plateau`` (``converged``), or
``step_limit`` (still gaining after ``rounds`` rounds: not converged, left out of fits).

Each result row: the run's configuration, memorized (examples memorized by gradient descent), accuracy,
converged, stop_reason, rounds_trained, lower_bound = H(min(n, d_h)-1)+1 (blank where n > d), the capacity
certificate of the trained and of the initial attention (rank, guaranteed = min(rank, N), readout_hits,
rtol, margin), saturation, steps (per round), rounds (at most), steps_trained, seconds, dtype and device;
the sweep runner adds the provenance.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from auditor.core.errors import AuditError
from auditor.lab.common.mha.certify import (
    attention_features,
    certify,
    lower_bound,
    proposition2_bound,
    readout_realizable,
)
from auditor.lab.common.mha.data import DataConfig, MemorizeData, derived_seed, make_data
from auditor.lab.common.mha.model import MHAConfig, MHAEnsemble
from auditor.lab.common.mha.saturation import saturation
from auditor.lab.common.mha.task import MemorizeTask
from auditor.lab.engine import TrainConfig, train
from auditor.lab.experiment import option
from auditor.lab.sweep import unit_key, write_table


@dataclass(frozen=True)
class MemorizeRun:
    """One layer memorizing one synthetic dataset (one member of a bucket)."""

    heads: int
    context: int  # n
    d_h: int
    N: int
    seed: int = 0  # data and initialisation
    d: int = 64
    d_v: int | None = None  # default: d_h for spec, 1 for authors (their code)
    task: str = "classification"
    classes: int = 100
    outputs: int = 1  # regression label width
    shared_context: bool = True
    variant: str = "spec"
    d_model: int | None = None  # authors only; default d

    def __post_init__(self) -> None:
        self.data_config()  # validates N, n, d, task, classes
        self.model_config()  # validates H, d_h (<= width), d_v, variant

    @property
    def value_width(self) -> int:
        if self.d_v is not None:
            return self.d_v
        return 1 if self.variant == "authors" else self.d_h

    def data_config(self) -> DataConfig:
        return DataConfig(N=self.N, context=self.context, d=self.d, task=self.task, classes=self.classes,
                          outputs=self.outputs, shared_context=self.shared_context, seed=self.seed)

    def model_config(self) -> MHAConfig:
        outputs = self.classes if self.task == "classification" else self.outputs
        return MHAConfig(heads=self.heads, d=self.d, d_h=self.d_h, d_v=self.value_width, outputs=outputs,
                         variant=self.variant, d_model=self.d_model if self.variant == "authors" else None,
                         seed=self.seed)

    @property
    def bound(self) -> int | None:
        """Theorem 1's lower bound H(min(n, d_h)-1)+1, or None where it does not apply (n > d)."""
        return lower_bound(self.heads, self.context, self.d_h, self.d)[0]

    def bucket_key(self) -> tuple:
        """Runs with equal keys can share one ensemble."""
        cfg = self.model_config()
        return (self.d, self.task, cfg.outputs, self.shared_context, self.variant, cfg.width)


@dataclass(frozen=True)
class MemorizeSettings:
    """Training and measurement settings shared by every run of a sweep (its options are those of
    ``audit capacity``, whose presets set the defaults shown)."""

    steps: int = option(
        5000, "Optimisation steps per round (one warm-up + cosine cycle).", default_help="3000"
    )
    lr: float = option(1e-3, "Peak Adam learning rate.", parse="floats", default_help="1e-2")
    batch_size: int = option(256, "Minibatch size; N <= batch trains full-batch.", default_help="512")
    eval_every: int = option(100, "Full-set accuracy (early stop) every k steps.", default_help="50")
    warmup_frac: float = 0.05
    warmup_start: float = 0.01
    schedule: str = "cosine"
    error_tolerance: float = 0.05  # regression: |prediction - label| <= error_tolerance counts as memorized
    certify: bool = option(True, "Rank certificates of the initial and trained attention.")
    rtol: float | None = None  # relative rank tolerance; None: max(N, H w) * eps(float32)
    saturation_threshold: float = 0.99
    bucket_size: int = option(16, "Max configurations trained together.")
    order_seed: int = 0  # data order (shared by a bucket)
    device: str = option("cpu", "cpu | cuda | cuda:<i>.")
    checkpoint_every: int = 1000
    rounds: int = option(
        4,
        "Max training rounds; a member that has not memorized every example trains another "
        "cycle of --steps from its weights until a round gains at most --plateau x N examples.",
    )
    plateau: float = option(
        0.01,
        "Convergence: a round adding at most this share of N memorized examples is a plateau; in (0, 1).",
        parse="floats",
    )

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.bucket_size < 1:
            raise AuditError("batch_size and bucket_size must be >= 1")
        if not 1 <= self.rounds <= 100:
            raise AuditError(f"rounds must be in 1..100, got {self.rounds}")
        if not 0 < self.plateau < 1:
            raise AuditError(
                f"plateau (share of N a round may add and still count as converged) must be in (0, 1), "
                f"got {self.plateau}"
            )
        if not 0 < self.error_tolerance < 0.5:  # also refuses NaN and infinity
            raise AuditError(
                f"error_tolerance must be in (0, 0.5), got {self.error_tolerance}: regression labels are "
                "uniform in [0, 1), so at 0.5 or more the constant prediction 0.5 memorizes every example"
            )
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise AuditError(f"device must be cpu, cuda or cuda:<index>, got {self.device!r}")
        self.train_config(None)  # validates steps, lr, schedule, warm-up

    def train_config(self, checkpoint: str | None, round: int = 1) -> TrainConfig:
        """The engine's config of training round ``round`` (1-based; later rounds draw another data order)."""
        seed = self.order_seed if round == 1 else derived_seed(self.order_seed, f"round {round}")
        return TrainConfig(steps=self.steps, lr=self.lr, warmup_frac=self.warmup_frac,
                           warmup_start=self.warmup_start, schedule=self.schedule, eval_every=self.eval_every,
                           seed=seed, checkpoint=checkpoint, checkpoint_every=self.checkpoint_every)


KEY_DEFAULTS = {"runs": [MemorizeRun], "settings": MemorizeSettings}  # a unit's key leaves these defaults out


def paper_steps(N: int, batch_size: int = 256, epochs: int = 500, minimum: int = 50_000) -> int:
    """The authors' step rule: max(epochs * N / batch_size, minimum)."""
    return max(epochs * N // batch_size, minimum)


def grid(
    heads: Sequence[int], context: Sequence[int], d_h: Sequence[int], N: Sequence[int], seeds: Sequence[int],
    **common: Any,
) -> list[MemorizeRun]:
    """The Cartesian product of the swept values (duplicates removed, order kept)."""
    runs = [MemorizeRun(heads=H, context=n, d_h=dh, N=size, seed=seed, **common)
            for H, n, dh, size, seed in itertools.product(heads, context, d_h, N, seeds)]
    return list(dict.fromkeys(runs))


_STEP_OVERHEAD = (
    5e6  # a training step's fixed cost (dispatch, small ops) in forward multiply-adds (~2 ms, one core)
)
_MAX_WASTE = 1.5  # a bucket's padded step may cost at most this factor more than its members' own compute


def _shape(run: MemorizeRun, batch_size: int) -> tuple[int, ...]:
    cfg = run.model_config()
    return (min(run.N, batch_size), run.heads, cfg.width, run.d_h, run.value_width, run.context, cfg.outputs)


def _cost(shape: tuple[int, ...]) -> float:
    """Multiply-adds of one forward step: B H (w d_h + n d_h + n d_v + d_v w) + B w d_o."""
    B, H, w, dh, dv, n, o = shape
    return B * H * (w * dh + n * dh + n * dv + dv * w) + B * w * o


def buckets(runs: Sequence[MemorizeRun], settings: MemorizeSettings) -> list[list[MemorizeRun]]:
    """Group compatible runs, sort by cost, and cut greedily: a bucket closes when it is full or when
    padding every member to the bucket's largest shape would make a step cost more than 1.5 times the
    members' own compute (both plus one step overhead, so tiny members always share a bucket)."""
    groups: dict[tuple, list[MemorizeRun]] = {}
    for run in runs:
        groups.setdefault(run.bucket_key(), []).append(run)
    out: list[list[MemorizeRun]] = []
    for members in groups.values():
        members = sorted(
            members, key=lambda r: (_cost(_shape(r, settings.batch_size)), r.context, r.N, r.seed)
        )
        current: list[MemorizeRun] = []
        for run in members:
            trial = [*current, run]
            shapes = [_shape(r, settings.batch_size) for r in trial]
            padded = len(trial) * _cost(tuple(map(max, zip(*shapes)))) + _STEP_OVERHEAD
            own = sum(_cost(sh) for sh in shapes) + _STEP_OVERHEAD
            if current and (len(current) >= settings.bucket_size or padded > _MAX_WASTE * own):
                out.append(current)
                trial = [run]
            current = trial
        out.append(current)
    return out


def make_units(
    runs: Sequence[MemorizeRun], settings: MemorizeSettings, workdir: str | Path
) -> list[dict[str, Any]]:
    """One sweep unit per bucket of :func:`buckets`."""
    if not runs:
        raise AuditError("the sweep has no runs; give at least one value for every swept option")
    return [{"kind": "memorize", "runs": [dataclasses.asdict(r) for r in bucket],
             "settings": dataclasses.asdict(settings), "workdir": str(workdir)}
            for bucket in buckets(runs, settings)]


def _device(name: str) -> torch.device:
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise AuditError(f"device {name!r} requested but CUDA is not available; use --device cpu")
    return torch.device(name)


STOP_REASONS = ("all_memorized", "plateau", "step_limit")  # the first two are converged


def _certify_member(
    model: MHAEnsemble, i: int, data: MemorizeData, settings: MemorizeSettings
) -> dict[str, Any]:
    cert = certify(attention_features(model, data, i), data.labels, task=data.task, classes=data.classes,
                   error_tolerance=settings.error_tolerance, rtol=settings.rtol)
    return {
        "rank": cert.rank,
        "guaranteed": cert.guaranteed,
        "readout_hits": cert.readout_hits,
        "rtol": cert.rtol,
        "rank_margin": cert.margin,
    }


@dataclass
class Rounds:
    """What :func:`train_rounds` returns, per member of the full ensemble."""

    memorized: list[int]
    stop_reason: list[str]
    rounds_trained: list[int]
    steps_trained: list[int]
    seconds: float
    history: (
        pd.DataFrame
    )  # the engine's history of every round: member (full index), round, step (cumulative)

    @property
    def converged(self) -> list[bool]:
        return [reason != "step_limit" for reason in self.stop_reason]


def train_rounds(model: MHAEnsemble, datasets: Sequence[MemorizeData], settings: MemorizeSettings, *,
                 checkpoint: str | None = None, progress: bool = False) -> Rounds:
    """Train every member to convergence: rounds of ``settings.steps`` (warm-up + cosine, fresh optimiser)
    from the previous round's weights, each round only for the members still going. A member stops with
    ``all_memorized`` (early stop at 100%), ``plateau`` (its round added at most ``plateau`` x N memorized
    examples; needs a previous round to compare with) or, after ``rounds`` rounds, ``step_limit``.
    Round r checkpoints to ``checkpoint`` (r = 1) or ``<stem>.round<r>.pt``, so a rerun resumes exactly."""
    E = model.num_members
    device = model.W_Q.device
    memorized, previous = [0] * E, [None] * E
    reason: list[str | None] = [None] * E
    rounds_trained, steps_trained = [0] * E, [0] * E
    histories, seconds = [], 0.0
    going = list(range(E))
    for r in range(1, settings.rounds + 1):
        if not going:
            break
        part = model if len(going) == E else model.subset(going)
        task = MemorizeTask([datasets[i] for i in going], settings.batch_size,
                            error_tolerance=settings.error_tolerance, device=device)
        path = (
            checkpoint if checkpoint is None or r == 1 else str(Path(checkpoint).with_suffix(f".round{r}.pt"))
        )
        result = train(part, task, settings.train_config(path, r), progress=progress)
        if part is not model:
            model.load_members(part, going)
        with torch.no_grad():
            counts = task.memorized_mask(part).sum(1).cpu().tolist()
        seconds += result.seconds
        histories.append(result.history.assign(member=[going[m] for m in result.history["member"]], round=r,
                                               step=result.history["step"] + (r - 1) * settings.steps))
        for j, i in enumerate(going):
            memorized[i], rounds_trained[i] = int(counts[j]), r
            steps_trained[i] += int(result.steps_trained[j])
            if memorized[i] >= datasets[i].N:
                reason[i] = "all_memorized"
            elif previous[i] is not None and memorized[i] - previous[i] <= settings.plateau * datasets[i].N:
                reason[i] = "plateau"
            previous[i] = memorized[i]
        going = [i for i in going if reason[i] is None]
    return Rounds(memorized, [why or "step_limit" for why in reason], rounds_trained, steps_trained, seconds,
                  pd.concat(histories, ignore_index=True))


def fit_bucket(configs: Sequence[MHAConfig], datasets: Sequence[MemorizeData], settings: MemorizeSettings, *,
               checkpoint: str | None = None, history: str | Path | None = None,
               saturation_path: str | Path | None = None, progress: bool = False,
               unit: str | None = None) -> list[dict[str, Any]]:
    """Train the layers ``configs`` (member i on ``datasets[i]``) together to convergence
    (:func:`train_rounds`) and measure each member.

    Returns one dict per member: memorized, accuracy, converged, stop_reason, rounds_trained, steps_trained,
    seconds (of the whole bucket), the certificate of the trained attention (rank, guaranteed,
    readout_hits, rtol, rank_margin) and of the initial attention (``*_init``), and saturation (mean
    saturated share of heads, share of examples with a free head). ``history`` receives the training
    history CSV (every round); ``saturation_path`` a long CSV with, per member, every head's saturated
    share (``kind = head``) and the examples by number of saturated heads (``kind = histogram``); both
    carry each member's seed, the provenance columns and the key ``unit``.
    """
    device = _device(settings.device)
    model = MHAEnsemble(configs, max_context=max(ds.n for ds in datasets)).to(device)
    task = MemorizeTask(
        datasets, settings.batch_size, error_tolerance=settings.error_tolerance, device=device
    )
    initial = [
        _certify_member(model, i, ds, settings) if settings.certify else {} for i, ds in enumerate(datasets)
    ]
    result = train_rounds(model, datasets, settings, checkpoint=checkpoint, progress=progress)
    seeds = [cfg.seed for cfg in configs]
    if history is not None:
        write_table(result.history.assign(seed=[seeds[m] for m in result.history["member"]]), history,
                    device=str(device), unit=unit)
    with torch.no_grad():
        memorized = task.memorized_mask(model).sum(1).cpu()
    out, sat_rows = [], []
    for i, (cfg, ds) in enumerate(zip(configs, datasets)):
        ceiling = min(ds.N, cfg.heads * cfg.width, proposition2_bound(cfg.heads, ds.n) if ds.shared else ds.N)
        trained = _certify_member(model, i, ds, settings) if settings.certify else {}
        sat = saturation(task.attention_weights(model, i), settings.saturation_threshold)
        sat_rows += [{"member": i, "seed": cfg.seed, "kind": "head", "index": h, "value": v}
                     for h, v in enumerate(sat.per_head.tolist())]
        sat_rows += [{"member": i, "seed": cfg.seed, "kind": "histogram", "index": k, "value": c}
                     for k, c in enumerate(torch.bincount(sat.per_example, minlength=cfg.heads + 1).tolist())]
        out.append({
            "memorized": int(memorized[i]), "accuracy": float(memorized[i]) / ds.N,
            "converged": result.converged[i], "stop_reason": result.stop_reason[i],
            "rounds_trained": result.rounds_trained[i],
            **{k: trained.get(k) for k in ("guaranteed", "readout_hits", "rank", "rtol", "rank_margin")},
            **{f"{k}_init": initial[i].get(k) for k in ("guaranteed", "readout_hits", "rank", "rank_margin")},
            "rank_ceiling": ceiling,
            "readout_realizable": readout_realizable(cfg.d_v, cfg.width, 2 if ds.task == "classification"
                                                     else ds.labels.shape[1]),
            "saturated_fraction": float(sat.per_head.mean()), "with_free_head": sat.with_free_head,
            "steps_trained": result.steps_trained[i], "steps": settings.steps, "rounds": settings.rounds,
            "plateau": settings.plateau, "seconds": result.seconds,
            "bucket_members": len(configs), "lr": settings.lr, "batch_size": settings.batch_size,
            "order_seed": settings.order_seed, "dtype": "float32", "device": str(device),
        })
    if saturation_path is not None:
        write_table(pd.DataFrame(sat_rows), saturation_path, device=str(device), unit=unit)
    return out


def run_unit(unit: dict[str, Any], progress: bool = False,
             make: Callable[[DataConfig], MemorizeData] = make_data) -> list[dict[str, Any]]:
    """Train one bucket of synthetic runs and return one row per run; the sweep runner's unit function.
    ``make`` draws the dataset of a run (another task, e.g. shared queries, passes its own)."""
    runs = [MemorizeRun(**r) for r in unit["runs"]]
    settings = MemorizeSettings(**unit["settings"])
    cache: dict[DataConfig, MemorizeData] = {}
    for run in runs:
        if run.data_config() not in cache:
            cache[run.data_config()] = make(run.data_config())
    datasets = [cache[r.data_config()] for r in runs]  # identical datasets are stored once
    workdir = Path(unit["workdir"])
    key = unit_key(unit, KEY_DEFAULTS)
    measured = fit_bucket([r.model_config() for r in runs], datasets, settings,
                          checkpoint=str(workdir / "checkpoints" / f"{key}.pt"),
                          history=workdir / "history" / f"{key}.csv",
                          saturation_path=workdir / "saturation" / f"{key}.csv", progress=progress, unit=key)
    return [
        {**dataclasses.asdict(run), "d_v": run.value_width, "lower_bound": run.bound,
         "lower_bound_note": lower_bound(run.heads, run.context, run.d_h, run.d)[1], "member": i,
         "shared_bound": proposition2_bound(run.heads, run.context) if run.shared_context else None,
         "parameters": run.model_config().num_parameters,
         "error_tolerance": settings.error_tolerance if run.task == "regression" else None,
         **m, "history": f"history/{key}.csv", "saturation": f"saturation/{key}.csv"}
        for i, (run, m) in enumerate(zip(runs, measured))
    ]


CONVERGENCE_COLUMNS = ("converged", "stop_reason", "rounds_trained")
CERTIFICATE_COLUMNS = (
    "guaranteed",
    "readout_hits",
    "rank",
    "rtol",
    "rank_margin",
    "guaranteed_init",
    "readout_hits_init",
    "rank_init",
    "rank_margin_init",
    "rank_ceiling",
    "readout_realizable",
)
TRAINING_COLUMNS = ("saturated_fraction", "with_free_head", "steps_trained", "steps", "rounds", "plateau",
                    "seconds", "bucket_members", "lr", "batch_size", "order_seed", "dtype", "device",
                    "history", "saturation")
COLUMNS = ("heads", "context", "d_h", "N", "seed", "d", "d_v", "task", "classes", "outputs", "shared_context",
           "variant", "d_model", "lower_bound", "lower_bound_note", "member", "shared_bound", "parameters",
           "error_tolerance", "memorized", "accuracy", *CONVERGENCE_COLUMNS, *CERTIFICATE_COLUMNS,
           *TRAINING_COLUMNS)
