"""The shared training engine of the capacity lab: many configurations train together as one model.

An :class:`Ensemble` is a batched model whose every parameter carries a leading member dimension E.
The optimisers used here (Adam, AdamW, SGD) act elementwise, so members never interact: summing the
per-member losses before ``backward`` hands each member exactly its own gradient, and the update below
is applied with a per-member step mask. A member that reaches the target accuracy is *frozen*: neither
its parameters nor its moment estimates change afterwards, so training member i inside an ensemble gives
the same result as training it alone (up to floating-point reassociation in the batched kernels).

:func:`train` runs the loop: linear warm-up then cosine (or constant) learning rate, full-set accuracy
every ``eval_every`` steps with early stopping, deterministic data order through one seeded
``torch.Generator`` handed to :meth:`Task.batch`, and atomic checkpoints that an interrupted run
resumes from to the same final parameters.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from auditor.core.atomic import write_atomic
from auditor.core.errors import AuditError, did_you_mean
from auditor.core.options import MAX_STEPS

log = logging.getLogger(__name__)

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("cosine", "constant")
# config fields that do not change the trajectory (a checkpoint written under other values still applies)
_RESUME_NEUTRAL = ("checkpoint", "checkpoint_every")
_CHECKPOINT_FORMAT = 1


class Ensemble(nn.Module):
    """Base for batched models: every parameter has leading dimension E (``num_members``).

    Subclasses set ``num_members`` in ``__init__`` and implement ``forward`` on batched inputs,
    returning per-member outputs with leading dimension E.
    """

    num_members: int

    def __init__(self, num_members: int) -> None:
        super().__init__()
        if num_members < 1:
            raise AuditError(f"an ensemble needs at least one member, got {num_members}")
        self.num_members = int(num_members)

    def check_members(self) -> None:
        """Raise if some parameter lacks the leading member dimension E."""
        for name, param in self.named_parameters():
            if param.dim() == 0 or param.shape[0] != self.num_members:
                raise AuditError(
                    f"parameter {name!r} has shape {tuple(param.shape)}; every parameter of an Ensemble "
                    f"needs leading dimension num_members={self.num_members}"
                )

    def member_state(self, member: int) -> dict[str, torch.Tensor]:
        """Detached copies of one member's parameters (name -> tensor without the E dimension)."""
        return {name: p.detach()[member].clone() for name, p in self.named_parameters()}


@dataclass(frozen=True)
class TrainConfig:
    """How to train an ensemble. Every member shares these settings (except ``member_lr``)."""

    steps: int  # max optimisation steps
    lr: float = 1e-3
    optimizer: str = "adam"  # "adam" | "adamw" | "sgd"
    weight_decay: float = 0.0  # L2 in the gradient for adam/sgd, decoupled for adamw
    warmup_frac: float = 0.05  # linear warm-up from warmup_start * lr over the first warmup_frac * steps
    warmup_start: float = 0.01
    schedule: str = "cosine"  # "cosine" (to 0 at `steps`) | "constant" (after warm-up)
    early_stop: bool = True  # a member that reaches target_accuracy stops updating (frozen)
    target_accuracy: float = 1.0
    eval_every: int = 100
    seed: int = 0  # seeds the generator passed to Task.batch (data order)
    checkpoint: str | None = None  # path; saved every checkpoint_every steps (atomic), resumed if present
    checkpoint_every: int = 1000
    betas: tuple[float, float] = (0.9, 0.999)  # adam / adamw
    eps: float = 1e-8
    momentum: float = 0.0  # sgd
    member_lr: tuple[float, ...] | None = None  # optional per-member base lr (length E) replacing lr
    grad_clip: float | None = None  # optional per-member gradient-norm clip

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise AuditError(f"steps must be >= 1, got {self.steps}")
        if not 0 < self.lr < math.inf:
            raise AuditError(f"lr must be a finite number > 0, got {self.lr}")
        if self.optimizer not in OPTIMIZERS:
            raise did_you_mean("optimizer", self.optimizer, OPTIMIZERS)
        if self.schedule not in SCHEDULES:
            raise did_you_mean("schedule", self.schedule, SCHEDULES)
        if not 0 <= self.weight_decay < math.inf:
            raise AuditError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if not 0 <= self.warmup_frac < 1:
            raise AuditError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if not 0 < self.warmup_start <= 1:
            raise AuditError(f"warmup_start must be in (0, 1], got {self.warmup_start}")
        if not 0 < self.target_accuracy <= 1:
            raise AuditError(f"target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if self.eval_every < 1 or self.checkpoint_every < 1:
            raise AuditError("eval_every and checkpoint_every must be >= 1")
        if self.steps > MAX_STEPS or self.eval_every > MAX_STEPS:
            raise AuditError(f"steps and eval_every take at most {MAX_STEPS:,}; got steps = {self.steps}, "
                             f"eval_every = {self.eval_every}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise AuditError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0 or not 0 <= self.momentum < 1:
            raise AuditError("eps must be > 0 and momentum in [0, 1)")
        if self.member_lr is not None and not all(0 < lr < math.inf for lr in self.member_lr):
            raise AuditError("every member_lr must be a finite number > 0")
        if self.grad_clip is not None and not 0 < self.grad_clip < math.inf:
            raise AuditError(f"grad_clip must be a finite number > 0, got {self.grad_clip}")

    @property
    def warmup_steps(self) -> int:
        return int(round(self.warmup_frac * self.steps))

    def lr_factor(self, step: int) -> float:
        """Multiplier of the base lr for update number ``step`` (0-based)."""
        warm = self.warmup_steps
        if step < warm:
            return self.warmup_start + (1.0 - self.warmup_start) * step / warm
        if self.schedule == "constant":
            return 1.0
        span = max(self.steps - warm, 1)
        return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / span))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON view (for result rows and the resume check)."""
        out = dataclasses.asdict(self)
        out["betas"] = list(self.betas)
        out["member_lr"] = None if self.member_lr is None else list(self.member_lr)
        return out


class Task(Protocol):
    """What the engine needs from a room. All tensors carry the member dimension E first."""

    def batch(self, step: int, generator: torch.Generator) -> Any:
        """Inputs for update number ``step``; draw all randomness from ``generator`` (a CPU generator)."""
        ...

    def loss(self, model: Ensemble, batch: Any) -> torch.Tensor:
        """(E,) per-member mean loss on ``batch``."""
        ...

    def accuracy(self, model: Ensemble) -> torch.Tensor:
        """(E,) accuracy of every member on its FULL training set (called under ``torch.no_grad``)."""
        ...


@dataclass
class TrainResult:
    """What :func:`train` returns."""

    accuracy: torch.Tensor  # (E,) final full-set accuracy
    steps_trained: torch.Tensor  # (E,) updates each member actually received (early stop)
    seconds: float  # wall time of this call (a resumed run counts only the resumed part)
    history: pd.DataFrame  # step, member, loss, accuracy, lr, active at every evaluation; loss = mean batch
    #                        loss since the previous evaluation (NaN at step 0), active = not yet frozen
    frozen: torch.Tensor | None = None  # (E,) bool: members early-stopped at the target accuracy
    resumed_from: int = 0  # step the run resumed from (0 = fresh)


class _MaskedOptimizer:
    """Adam / AdamW / SGD over ensemble parameters with a per-member step mask.

    All parameters are handled as one flat (E, P) block (P = parameters per member), so a step costs
    a fixed handful of tensor operations however many parameter tensors the model has. The step count
    ``t`` is per member (E,), so bias correction matches a member trained alone.
    """

    def __init__(self, params: list[nn.Parameter], config: TrainConfig, num_members: int) -> None:
        self.params = params
        self.config = config
        self.E = num_members
        device = params[0].device if params else torch.device("cpu")
        dtype = params[0].dtype if params else torch.float32
        if any(p.dtype != dtype or p.device != device for p in params):
            raise AuditError("every trainable parameter of an Ensemble must share one dtype and device")
        self.sizes = [p[0].numel() for p in params]
        P = sum(self.sizes)
        self.t = torch.zeros(num_members, dtype=torch.long, device=device)
        self.exp_avg = torch.zeros(num_members, P, dtype=dtype, device=device)  # (E, P)
        adam = config.optimizer != "sgd"
        self.exp_avg_sq = torch.zeros(num_members, P if adam else 0, dtype=dtype, device=device)  # (E, P)
        base = config.member_lr if config.member_lr is not None else (config.lr,) * num_members
        self.base_lr = torch.tensor(base, dtype=torch.float64, device=device)  # (E,)

    def state_dict(self) -> dict[str, Any]:
        return {"t": self.t, "exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.t.copy_(state["t"])
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.reshape(self.E, -1) for t in tensors], dim=1)  # (E, P)

    @torch.no_grad()
    def step(self, active: torch.Tensor, lr_factor: float) -> None:
        """One update of the members where ``active`` (E,) bool is True; the others stay bit-identical."""
        cfg = self.config
        if not self.params:
            return
        dtype = self.exp_avg.dtype
        p = self._flat([q.detach() for q in self.params])  # (E, P)
        g = self._flat([q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params])  # (E, P)
        if cfg.grad_clip is not None:
            norm = g.double().pow(2).sum(1).sqrt()  # (E,)
            g = g * (cfg.grad_clip / (norm + 1e-12)).clamp(max=1.0).to(dtype)[:, None]
        mask = active[:, None]  # (E, 1)
        everyone = bool(active.all())
        self.t += active.long()
        lr = (self.base_lr * lr_factor)[:, None]  # (E, 1) float64
        if cfg.optimizer == "sgd":
            if cfg.weight_decay:
                g = g + cfg.weight_decay * p
            if cfg.momentum:
                g = torch.where(mask, cfg.momentum * self.exp_avg + g, self.exp_avg)
                self.exp_avg.copy_(g)
            new = p - lr.to(dtype) * g
        else:
            beta1, beta2 = cfg.betas
            if cfg.optimizer == "adamw":
                decayed = p * (1 - lr * cfg.weight_decay).to(dtype)
            else:
                decayed = p
                if cfg.weight_decay:
                    g = g + cfg.weight_decay * p
            if everyone:  # in place, no masks (the common case before early stops)
                self.exp_avg.lerp_(g, 1 - beta1)
                self.exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            else:
                # the same arithmetic as the in-place branch, so a member's trajectory never depends on others
                m = torch.lerp(self.exp_avg, g, 1 - beta1)
                v = torch.addcmul(self.exp_avg_sq * beta2, g, g, value=1 - beta2)
                self.exp_avg.copy_(torch.where(mask, m, self.exp_avg))
                self.exp_avg_sq.copy_(torch.where(mask, v, self.exp_avg_sq))
            t = self.t.clamp(min=1).double()[:, None]  # (E, 1)
            denom = (self.exp_avg_sq.sqrt() / (1 - beta2**t).sqrt().to(dtype)).add_(cfg.eps)
            new = decayed - (lr / (1 - beta1**t)).to(dtype) * self.exp_avg / denom
        if not everyone:
            new = torch.where(mask, new, p)
        offset = 0
        for q, size in zip(self.params, self.sizes):
            q.copy_(new[:, offset : offset + size].reshape(q.shape))
            offset += size


def _save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    write_atomic(path, lambda tmp: torch.save(payload, tmp))


def _trajectory_config(config: TrainConfig) -> dict[str, Any]:
    return {k: v for k, v in config.to_dict().items() if k not in _RESUME_NEUTRAL}


def _load_checkpoint(path: Path, model: Ensemble, config: TrainConfig) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file is reported the same way
        raise AuditError(
            f"checkpoint {str(path)!r} is unreadable ({type(err).__name__}); delete it to restart"
        ) from None
    if payload.get("format") != _CHECKPOINT_FORMAT or payload.get("config") != _trajectory_config(config):
        raise AuditError(
            f"checkpoint {str(path)!r} was written by a different training configuration; "
            "delete it or choose another checkpoint path"
        )
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if {k: tuple(v.shape) for k, v in payload["model"].items()} != shapes:
        raise AuditError(f"checkpoint {str(path)!r} belongs to a model of other shapes; delete it to restart")
    return payload


@dataclass
class _Run:
    """One :func:`train` call: what it trains, and the state a checkpoint carries besides the model and
    the optimiser."""

    model: Ensemble
    task: Task
    config: TrainConfig
    opt: _MaskedOptimizer
    generator: torch.Generator  # data order
    active: torch.Tensor  # (E,) bool on the model's device: members not yet frozen
    steps_done: torch.Tensor  # (E,) long: updates each member received
    loss_sum: torch.Tensor  # (E,) float64: batch losses summed since the last evaluation
    loss_count: int = 0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    step: int = 0  # updates done
    finished: bool = False  # restored from the checkpoint of a finished run

    def restore(self, payload: dict[str, Any]) -> None:
        """Take the state of a checkpoint's ``payload`` (model, optimiser and this run)."""
        self.model.load_state_dict(payload["model"])
        self.opt.load_state_dict(payload["optimizer"])
        self.generator.set_state(payload["generator"])
        self.active.copy_(payload["active"])
        self.steps_done.copy_(payload["steps_done"])
        self.loss_sum.copy_(payload["loss_sum"])
        self.loss_count = int(payload["loss_count"])
        self.history = list(payload["history"])
        self.step = int(payload["step"])
        self.finished = bool(payload["done"])

    def payload(self, done: bool) -> dict[str, Any]:
        """What a checkpoint after the updates done so far holds."""
        return {
            "format": _CHECKPOINT_FORMAT,
            "config": _trajectory_config(self.config),
            "step": self.step,
            "done": done,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "generator": self.generator.get_state(),
            "active": self.active.cpu(),
            "steps_done": self.steps_done,
            "loss_sum": self.loss_sum,
            "loss_count": self.loss_count,
            "history": self.history,
        }

    def evaluate(self) -> torch.Tensor:
        """(E,) float64 full-set accuracy after the updates done so far; appends one history row per member
        and restarts the loss average."""
        model, config, E = self.model, self.config, self.model.num_members
        was_training = model.training
        model.eval()
        with torch.no_grad():
            acc = self.task.accuracy(model).detach().double().cpu()
        model.train(was_training)
        if acc.shape != (E,):
            raise AuditError(f"task.accuracy returned shape {tuple(acc.shape)}; expected ({E},)")
        mean_loss = (
            self.loss_sum / self.loss_count
            if self.loss_count
            else torch.full((E,), float("nan"), dtype=torch.float64)
        )
        factor = config.lr_factor(min(self.step, config.steps - 1))
        for member in range(E):
            self.history.append(
                {
                    "step": self.step,
                    "member": member,
                    "loss": float(mean_loss[member]),
                    "accuracy": float(acc[member]),
                    "lr": float(self.opt.base_lr[member]) * factor,
                    "active": bool(self.active[member]),
                }
            )
        self.loss_sum.zero_()
        self.loss_count = 0
        return acc

    def update(self) -> torch.Tensor:
        """Update number ``step`` of the active members; returns the (E,) batch losses."""
        E = self.model.num_members
        batch = self.task.batch(self.step, self.generator)
        losses = self.task.loss(self.model, batch)
        if losses.shape != (E,):
            raise AuditError(f"task.loss returned shape {tuple(losses.shape)}; expected ({E},)")
        for p in self.opt.params:
            p.grad = None
        torch.where(self.active, losses, torch.zeros_like(losses)).sum().backward()
        self.opt.step(self.active, self.config.lr_factor(self.step))
        self.steps_done += self.active.cpu().long()
        self.loss_sum += losses.detach().double().cpu()
        self.loss_count += 1
        self.step += 1
        return losses


def train(
    model: Ensemble,
    task: Task,
    config: TrainConfig,
    *,
    progress: bool = True,
    log_every: int | None = None,
) -> TrainResult:
    """Train every member of ``model`` on ``task``; stop each member at the target accuracy.

    The loop, for update ``s = 0 .. steps-1``: evaluate full-set accuracy when ``s % eval_every == 0``
    (and freeze members at the target if ``early_stop``); stop when no member is active; draw
    ``task.batch(s, generator)``; backward the sum of the active members' losses; apply the masked
    update with lr ``base * lr_factor(s)``. A final evaluation follows the last update.

    Args:
        model: the ensemble (its parameters are updated in place; on resume they are overwritten by
            the checkpoint's).
        task: supplies batches, per-member losses (E,) and full-set accuracies (E,).
        config: optimiser, schedule, early stop, seed, checkpointing.
        progress: show a tqdm bar over steps.
        log_every: log mean loss and active members through ``logging`` every this many steps.
    """
    model.check_members()
    E = model.num_members
    if config.member_lr is not None and len(config.member_lr) != E:
        raise AuditError(f"member_lr has {len(config.member_lr)} entries for an ensemble of {E} members")
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    run = _Run(model, task, config, _MaskedOptimizer(params, config, E),
               generator=torch.Generator().manual_seed(config.seed),
               active=torch.ones(E, dtype=torch.bool, device=device),
               steps_done=torch.zeros(E, dtype=torch.long), loss_sum=torch.zeros(E, dtype=torch.float64))
    ckpt_path = Path(config.checkpoint) if config.checkpoint else None
    if ckpt_path is not None and (payload := _load_checkpoint(ckpt_path, model, config)) is not None:
        run.restore(payload)
        log.info("resumed from %s at step %d", ckpt_path, run.step)
    start = run.step

    t0 = time.perf_counter()
    bar = tqdm(total=config.steps, initial=start, desc="train", disable=not progress, leave=False)
    last_eval: int | None = None
    try:
        while not run.finished and run.step < config.steps:
            if run.step % config.eval_every == 0:
                acc = run.evaluate()
                last_eval = run.step
                if config.early_stop:
                    run.active &= (acc < config.target_accuracy - 1e-12).to(device)
                if not bool(run.active.any()):
                    break
            losses = run.update()
            bar.update()
            if log_every and run.step % log_every == 0:
                log.info("step %d: mean loss %.4g, %d/%d members active", run.step,
                         float(losses.detach().mean()), int(run.active.sum()), E)
            if ckpt_path is not None and run.step % config.checkpoint_every == 0 and run.step < config.steps:
                _save_checkpoint(ckpt_path, run.payload(done=False))
    finally:
        bar.close()
        for p in params:
            p.grad = None

    if run.finished or last_eval == run.step:
        final = torch.tensor([row["accuracy"] for row in run.history[-E:]], dtype=torch.float64)
    else:
        final = run.evaluate()
    if ckpt_path is not None:
        _save_checkpoint(ckpt_path, run.payload(done=True))
    return TrainResult(
        accuracy=final.float(),
        steps_trained=run.steps_done.clone(),
        seconds=time.perf_counter() - t0,
        history=pd.DataFrame(run.history, columns=["step", "member", "loss", "accuracy", "lr", "active"]),
        frozen=(~run.active).cpu(),
        resumed_from=start,
    )
