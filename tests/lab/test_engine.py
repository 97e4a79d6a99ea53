"""The shared training engine: masked optimiser, early stop, ensemble = members alone, resume."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import forward_atol
from torch import nn

from auditor.core.errors import AuditError
from auditor.lab.engine import Ensemble, TrainConfig, _MaskedOptimizer, train


class SoftmaxRegression(Ensemble):
    """E independent linear classifiers: logits = x W + b, W: (E, d, C)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__(weight.shape[0])
        self.weight = nn.Parameter(weight.clone())  # (E, d, C)
        self.bias = nn.Parameter(bias.clone())  # (E, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (E, B, d) -> logits (E, B, C)."""
        return torch.einsum("ebd,edc->ebc", x, self.weight) + self.bias[:, None, :]  # (E, B, C)


class RandomLabels:
    """Each member memorizes its own N random points with random labels; minibatches share indices."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
        self.x, self.y, self.batch_size = x, y, batch_size  # (E, N, d), (E, N)

    def batch(self, step: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(self.x.shape[1], (self.batch_size,), generator=generator)  # (B,)

    def loss(self, model: Ensemble, batch: torch.Tensor) -> torch.Tensor:
        logits = model(self.x[:, batch])  # (E, B, C)
        ce = nn.functional.cross_entropy(logits.transpose(1, 2), self.y[:, batch], reduction="none")  # (E, B)
        return ce.mean(1)

    def accuracy(self, model: Ensemble) -> torch.Tensor:
        return (model(self.x).argmax(-1) == self.y).float().mean(1)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def trained_atol(steps: int, weight: torch.Tensor, d: int, C: int, B: int) -> float:
    """How far two trainings of one softmax regression that sum in different orders may end apart: each
    step's gradient sums over d (logits), C (softmax) and the B examples, + a few flops of the optimizer
    update, i.e. one ``forward_atol`` of width d + C + B + 8 relative to the weights; to first order the
    steps' differences add up."""
    return steps * forward_atol(weight, d + C + B + 8)


def make_problem(E: int, N: int = 16, d: int = 8, C: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(E, N, d, generator=g)
    y = torch.randint(C, (E, N), generator=g)
    w = 0.1 * torch.randn(E, d, C, generator=g)
    b = torch.zeros(E, C)
    return x, y, w, b


def test_schedule_known_values():
    cfg = TrainConfig(steps=1000, warmup_frac=0.1, warmup_start=0.01)
    assert cfg.warmup_steps == 100
    assert cfg.lr_factor(0) == pytest.approx(0.01)
    assert cfg.lr_factor(50) == pytest.approx(0.01 + 0.99 * 0.5)
    assert cfg.lr_factor(100) == pytest.approx(1.0)
    assert cfg.lr_factor(550) == pytest.approx(0.5)
    assert cfg.lr_factor(999) == pytest.approx(0.5 * (1 + math.cos(math.pi * 899 / 900)))
    assert TrainConfig(steps=10, schedule="constant", warmup_frac=0).lr_factor(7) == 1.0


@pytest.mark.parametrize(
    ("optimizer", "extra", "reference"),
    [
        ("adam", {}, lambda p, lr: torch.optim.Adam(p, lr=lr)),
        ("adam", {"weight_decay": 0.01}, lambda p, lr: torch.optim.Adam(p, lr=lr, weight_decay=0.01)),
        ("adamw", {"weight_decay": 0.1}, lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.1)),
        ("sgd", {"momentum": 0.9}, lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9)),
    ],
)
def test_single_member_matches_torch_optim(optimizer, extra, reference):
    """With one member and no early stop, the engine is exactly torch.optim + LambdaLR."""
    x, y, w, b = make_problem(1)
    cfg = TrainConfig(steps=40, lr=0.05, optimizer=optimizer, warmup_frac=0.1, early_stop=False,
                      eval_every=7, seed=3, **extra)
    model = SoftmaxRegression(w, b)
    task = RandomLabels(x, y, batch_size=4)
    train(model, task, cfg, progress=False)

    ref = SoftmaxRegression(w, b)
    opt = reference(list(ref.parameters()), cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cfg.lr_factor)
    gen = torch.Generator().manual_seed(cfg.seed)
    for step in range(cfg.steps):
        idx = task.batch(step, gen)
        opt.zero_grad()
        task.loss(ref, idx).sum().backward()
        opt.step()
        sched.step()
    for got, want in ((model.weight, ref.weight), (model.bias, ref.bias)):
        torch.testing.assert_close(got, want, rtol=0, atol=trained_atol(cfg.steps, want, 8, 5, 4))


def test_masked_step_freezes_inactive_members_bitwise():
    x, y, w, b = make_problem(3)
    model = SoftmaxRegression(w, b)
    opt = _MaskedOptimizer(list(model.parameters()), TrainConfig(steps=10), 3)
    task = RandomLabels(x, y, batch_size=8)
    task.loss(model, torch.arange(8)).sum().backward()
    opt.step(torch.tensor([True, True, True]), 1.0)  # everyone moves once (moments become non-zero)
    before_w, before_m, before_v = model.weight.detach().clone(), opt.exp_avg.clone(), opt.exp_avg_sq.clone()
    model.zero_grad()
    task.loss(model, torch.arange(8)).sum().backward()
    assert model.weight.grad[1].abs().sum() > 0
    opt.step(torch.tensor([True, False, True]), 1.0)
    assert torch.equal(model.weight[1], before_w[1])
    assert torch.equal(opt.exp_avg[1], before_m[1]) and torch.equal(opt.exp_avg_sq[1], before_v[1])
    assert not torch.equal(opt.exp_avg_sq[0], before_v[0])
    assert not torch.equal(model.weight[0], before_w[0])
    assert opt.t.tolist() == [2, 1, 2]


def test_reaches_full_accuracy_and_stops_early():
    x, y, w, b = make_problem(2, N=12, d=16)
    model = SoftmaxRegression(w, b)
    res = train(
        model, RandomLabels(x, y, 12), TrainConfig(steps=2000, lr=0.05, eval_every=10), progress=False
    )
    assert res.accuracy.tolist() == [1.0, 1.0]
    assert (res.steps_trained < 2000).all() and bool(res.frozen.all())
    assert set(res.history.columns) >= {"step", "member", "loss", "accuracy"}
    # the history ends with each member at 100% and its step count is a multiple of eval_every
    assert (res.steps_trained % 10 == 0).all()


def test_members_in_ensemble_match_members_trained_alone():
    """Members of very different difficulty stop at different steps, yet each equals its solo run."""
    E = 4
    x, y, w, b = make_problem(E, N=24, d=10, C=4, seed=1)
    x[0] *= 5.0  # an easy member (well separated) stops first
    y[3] = 0  # a trivial member: stops after the first evaluations
    cfg = TrainConfig(steps=300, lr=0.03, eval_every=5, seed=11)
    together = SoftmaxRegression(w, b)
    res = train(together, RandomLabels(x, y, 6), cfg, progress=False)
    assert len(set(res.steps_trained.tolist())) > 1, "test needs members that stop at different steps"
    for i in range(E):
        alone = SoftmaxRegression(w[i : i + 1], b[i : i + 1])
        solo = train(alone, RandomLabels(x[i : i + 1], y[i : i + 1], 6), cfg, progress=False)
        assert solo.steps_trained.item() == res.steps_trained[i].item()
        assert solo.accuracy.item() == res.accuracy[i].item()
        atol = trained_atol(cfg.steps, alone.weight[0], 10, 4, 6)
        torch.testing.assert_close(alone.weight[0], together.weight[i], rtol=0, atol=atol)


class Interrupt(Exception):
    pass


class InterruptingTask(RandomLabels):
    def __init__(self, *args, at: int) -> None:
        super().__init__(*args)
        self.at = at

    def batch(self, step, generator):
        if step == self.at:
            raise Interrupt
        return super().batch(step, generator)


def test_resume_after_interruption_equals_uninterrupted(tmp_path):
    x, y, w, b = make_problem(3, N=20, d=6, C=4, seed=2)
    ckpt = tmp_path / "run.pt"
    cfg = TrainConfig(steps=120, lr=0.02, eval_every=10, seed=5, checkpoint=str(ckpt), checkpoint_every=25)
    plain = TrainConfig(**{**cfg.__dict__, "checkpoint": None})

    reference = SoftmaxRegression(w, b)
    ref = train(reference, RandomLabels(x, y, 5), plain, progress=False)

    broken = SoftmaxRegression(w, b)
    with pytest.raises(Interrupt):
        train(broken, InterruptingTask(x, y, 5, at=63), cfg, progress=False)
    assert ckpt.exists()

    resumed = SoftmaxRegression(w, b)  # a fresh process: initial weights again, checkpoint on disk
    res = train(resumed, RandomLabels(x, y, 5), cfg, progress=False)
    assert res.resumed_from == 50
    # same process, same batches: the checkpoint's values read back, then the same kernels: bit-identical
    assert torch.equal(resumed.weight, reference.weight) and torch.equal(resumed.bias, reference.bias)
    assert torch.equal(res.steps_trained, ref.steps_trained) and torch.equal(res.accuracy, ref.accuracy)
    assert res.history.equals(ref.history)

    # a finished checkpoint returns the result without training again
    again = SoftmaxRegression(w, b)
    res2 = train(again, RandomLabels(x, y, 5), cfg, progress=False)
    assert res2.resumed_from == int(ref.history["step"].max())
    assert torch.equal(again.weight, reference.weight)
    assert res2.history.equals(ref.history)


def test_checkpoint_of_other_config_is_refused(tmp_path):
    x, y, w, b = make_problem(1)
    ckpt = str(tmp_path / "c.pt")
    train(
        SoftmaxRegression(w, b), RandomLabels(x, y, 4), TrainConfig(steps=5, checkpoint=ckpt), progress=False
    )
    with pytest.raises(AuditError, match="different training configuration"):
        train(SoftmaxRegression(w, b), RandomLabels(x, y, 4), TrainConfig(steps=6, checkpoint=ckpt),
              progress=False)


def test_deterministic_given_seed():
    x, y, w, b = make_problem(2)
    runs = []
    for seed in (0, 0, 1):
        model = SoftmaxRegression(w, b)
        cfg = TrainConfig(steps=30, lr=0.05, seed=seed, early_stop=False)
        train(model, RandomLabels(x, y, 3), cfg, progress=False)
        runs.append(model.weight.detach().clone())
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


@pytest.mark.parametrize("field", ["lr", "weight_decay", "grad_clip", "member_lr"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_non_finite_rates_are_refused(field, value):
    with pytest.raises(AuditError, match="finite"):
        TrainConfig(steps=10, **{field: (value,) if field == "member_lr" else value})


def test_invalid_configs_raise_audit_error():
    with pytest.raises(AuditError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(AuditError, match="did you mean 'adam'"):
        TrainConfig(steps=10, optimizer="adma")
    with pytest.raises(AuditError, match="warmup_frac"):
        TrainConfig(steps=10, warmup_frac=1.5)
    x, y, w, b = make_problem(2)
    with pytest.raises(AuditError, match="member_lr"):
        train(SoftmaxRegression(w, b), RandomLabels(x, y, 4), TrainConfig(steps=3, member_lr=(0.1,)),
              progress=False)


def test_parameter_without_member_dim_is_rejected():
    class Broken(Ensemble):
        def __init__(self):
            super().__init__(3)
            self.w = nn.Parameter(torch.zeros(2, 4))

    with pytest.raises(AuditError, match="leading dimension"):
        Broken().check_members()


def test_member_lr_gives_each_member_its_own_rate():
    """Two copies of the same member with lr a and b equal two solo runs with lr a and b."""
    x, y, w, b = make_problem(1)
    x2, y2, w2, b2 = (t.repeat(2, *([1] * (t.dim() - 1))) for t in (x, y, w, b))
    model = SoftmaxRegression(w2, b2)
    train(model, RandomLabels(x2, y2, 4), TrainConfig(steps=20, member_lr=(0.01, 0.1), early_stop=False),
          progress=False)
    for i, lr in enumerate((0.01, 0.1)):
        solo = SoftmaxRegression(w, b)
        train(solo, RandomLabels(x, y, 4), TrainConfig(steps=20, lr=lr, early_stop=False), progress=False)
        atol = trained_atol(20, solo.weight, 8, 5, 4)
        torch.testing.assert_close(solo.weight[0], model.weight[i], rtol=0, atol=atol)
