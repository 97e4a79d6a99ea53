"""Learning dynamics of factual recall (deliverable 3 of capacity lab III; paper C, Figure 5).

The simplified model of the paper's gradient-flow analysis: one-hot token embeddings (d = vocabulary
size), one linear-attention head (no softmax) in which the EOS position queries, and a linear read-out
to the R D answers:

    logits = V^T sum_t (e_EOS^T A e_t) e_t        A: (d, d),  V: (d, R D)

every entry of A and V starting at ``init`` (1e-5), trained by plain gradient descent (SGD without
momentum, constant lr 0.1) on fresh prompts of the structured fact table a(s, r) = floor(s D / S) + r D.
Members of the ensemble are data seeds. At every evaluation the task records, over ALL S R facts
(each in ``eval_contexts`` noisy prompts):

- ``loss``: the cross-entropy;
- ``relation_loss``: -ln P(answer in the right relation's block), ~0 once the relation is known;
- ``subject_loss``: -ln P(answer with the right offset a mod D inside a block), which for the structured
  table depends on the subject only;
- the matching accuracies.

:func:`run_dynamics` trains, then :func:`~auditor.lab.recall.stages.detect_stages` finds the stages. As
``audit recall dynamics`` the run is one sweep unit (in ``dynamics/``); ``dynamics_stages.csv`` holds the
stages, ``dynamics_curves.csv`` the curves.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch
from torch import nn

from auditor.core.atomic import write_text_atomic
from auditor.core.errors import AuditError
from auditor.lab.engine import Ensemble, TrainConfig, train
from auditor.lab.experiment import Experiment, option
from auditor.lab.recall.stages import Stages, detect_stages
from auditor.lab.recall.task import DEFAULT_PROMPT_LENGTH, FactBank, FactTable, PromptBatch, member_generator
from auditor.lab.sweep import stamp, unit_key, write_csv, write_table

_TRAIN_STREAM, _EVAL_STREAM = 3, 4


class LinearAttentionOneHot(Ensemble):
    """E linear-attention models on one-hot embeddings: A (E, d, d), V (E, d, A), d = vocabulary."""

    def __init__(
        self, num_members: int, vocab_size: int, num_answers: int, eos_token: int, init: float
    ) -> None:
        super().__init__(num_members)
        self.vocab_size, self.eos_token = vocab_size, eos_token
        self.attention = nn.Parameter(torch.full((num_members, vocab_size, vocab_size), float(init)))
        self.readout = nn.Parameter(torch.full((num_members, vocab_size, num_answers), float(init)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: (E, B, T) -> logits (E, B, A).

        With one-hot x_t, the score e_EOS^T A x_t is entry A[EOS, token_t] and sum_t score_t x_t puts
        each score at its token's coordinate: a gather and a scatter-add instead of (E, B, T, d) products.
        """
        E, B, _ = tokens.shape
        query = self.attention[:, self.eos_token, :]  # (E, d): e_EOS^T A
        scores = torch.gather(query[:, None, :].expand(E, B, -1), 2, tokens)  # (E, B, T), no softmax
        mixed = torch.zeros(E, B, self.vocab_size, dtype=scores.dtype).scatter_add(
            2, tokens, scores
        )  # (E, B, d)
        return torch.bmm(mixed, self.readout)  # (E, B, A)

    def forward_reference(self, tokens: torch.Tensor) -> torch.Tensor:
        """The same logits computed literally from one-hot embeddings (for tests)."""
        x = nn.functional.one_hot(tokens, self.vocab_size).to(self.attention.dtype)  # (E, B, T, d)
        query = self.attention[:, self.eos_token, :]  # (E, d)
        scores = torch.einsum("ebtd,ed->ebt", x, query)  # (E, B, T)
        mixed = torch.einsum("ebt,ebtd->ebd", scores, x)  # (E, B, d)
        return torch.bmm(mixed, self.readout)  # (E, B, A)


@dataclass(frozen=True)
class DynamicsConfig:
    """The paper's setting: S = 16, R = 4, D = 8, T = 32, init 1e-5, GD lr 0.1, 8192 steps, batch 1024."""

    subjects: int = 16
    relations: int = 4
    answers_per_relation: int = 8
    prompt_length: int = DEFAULT_PROMPT_LENGTH
    init: float = 1e-5
    lr: float = option(0.1, "Gradient-descent learning rate.", parse="floats")
    steps: int = option(8192, "Gradient-descent steps.")
    batch_size: int = 1024
    eval_every: int = 64
    eval_contexts: int = 16
    seeds: tuple[int, ...] = option(
        (0, 1, 2), "Data seeds (members of one ensemble).", default_help="per scale"
    )
    SUITE_FIXED: ClassVar[tuple[str, ...]] = ("steps", "lr")  # `recall all` keeps the paper's GD settings

    def __post_init__(self) -> None:
        FactTable(
            self.subjects, self.relations, self.answers_per_relation, structured=True
        )  # validates S, R, D
        if self.answers_per_relation < 2 or self.relations < 2:
            raise AuditError(
                "the stages need D >= 2 and R >= 2 (else ln D or ln R D coincide with 0 or each other)"
            )
        if self.steps < 1 or self.batch_size < 1 or self.eval_every < 1 or self.eval_contexts < 1:
            raise AuditError("steps, batch_size, eval_every and eval_contexts must be >= 1")
        if not self.init > 0 or not self.lr > 0:
            raise AuditError("init and lr must be > 0")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise AuditError(f"seeds must be distinct integers, got {self.seeds}")

    def table(self) -> FactTable:
        return FactTable(self.subjects, self.relations, self.answers_per_relation, structured=True)


class DynamicsTask:
    """Fresh prompts each step (per-seed streams); records the three losses at every evaluation."""

    def __init__(self, config: DynamicsConfig) -> None:
        self.config = config
        table = config.table()
        self.bank = FactBank([table] * len(config.seeds), config.prompt_length)
        self.seeds = list(config.seeds)
        self.eval_set = self.bank.all_facts(
            config.eval_contexts, [member_generator(s, _EVAL_STREAM) for s in self.seeds]
        )
        D, A = config.answers_per_relation, table.num_answers
        answer = torch.arange(A)
        ans = self.eval_set.answers  # (E, P)
        self.same_relation = (answer[None, None, :] // D) == (ans[..., None] // D)  # (E, P, A)
        self.same_offset = (answer[None, None, :] % D) == (ans[..., None] % D)  # (E, P, A)
        self.records: list[dict[str, Any]] = []
        self._next_step = 0

    def batch(self, step: int, generator: torch.Generator) -> PromptBatch:
        self._next_step = step + 1
        return self.bank.sample(
            self.config.batch_size, [member_generator(s, _TRAIN_STREAM, step) for s in self.seeds]
        )

    def loss(self, model: Ensemble, batch: PromptBatch) -> torch.Tensor:
        logits = model(batch.tokens)  # (E, B, A)
        nll = nn.functional.cross_entropy(logits.flatten(0, 1), batch.answers.flatten(), reduction="none")
        return nll.view_as(batch.answers).mean(1)  # (E,)

    def metrics(self, model: Ensemble) -> dict[str, torch.Tensor]:
        """(E,) total, relation-only and subject-only losses and accuracies over all facts."""
        with torch.no_grad():
            logp = torch.log_softmax(model(self.eval_set.tokens), dim=-1)  # (E, P, A)
        ans = self.eval_set.answers
        pred = logp.argmax(-1)
        D = self.config.answers_per_relation
        masked = lambda keep: torch.logsumexp(logp.masked_fill(~keep, float("-inf")), dim=-1)  # noqa: E731
        return {
            "loss": -logp.gather(-1, ans[..., None]).squeeze(-1).mean(1),
            "relation_loss": -masked(self.same_relation).mean(1),
            "subject_loss": -masked(self.same_offset).mean(1),
            "accuracy": (pred == ans).double().mean(1),
            "relation_accuracy": (pred // D == ans // D).double().mean(1),
            "subject_accuracy": (pred % D == ans % D).double().mean(1),
        }

    def accuracy(self, model: Ensemble) -> torch.Tensor:
        """(E,) accuracy over all facts; also records every metric at the current step."""
        values = self.metrics(model)
        for i, seed in enumerate(self.seeds):
            self.records.append(
                {"step": self._next_step, "seed": seed, **{k: float(v[i]) for k, v in values.items()}}
            )
        return values["accuracy"]


def run_dynamics(config: DynamicsConfig, *, progress: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train the linear-attention ensemble and detect the stages of every seed.

    Returns:
        (curves, stages): curves has one row per (step, seed) with the three losses and accuracies;
        stages one row per seed with the boundaries as step numbers (``uniform_end``,
        ``hallucination_start``, ``hallucination_end``, ``converged_at``) and the plateau levels.
    """
    table = config.table()
    model = LinearAttentionOneHot(
        len(config.seeds), table.vocab_size, table.num_answers, table.eos_token, config.init
    )
    task = DynamicsTask(config)
    tcfg = TrainConfig(
        steps=config.steps,
        lr=config.lr,
        optimizer="sgd",
        warmup_frac=0.0,
        schedule="constant",
        early_stop=False,
        eval_every=config.eval_every,
    )
    result = train(model, task, tcfg, progress=progress)
    settings = {k: v for k, v in asdict(config).items() if k != "seeds"}
    curves = pd.DataFrame(task.records).drop_duplicates(["step", "seed"], keep="last")
    curves = curves.assign(**settings, optimizer="sgd", dtype="float32")
    rows = []
    for seed in config.seeds:
        mine = curves[curves["seed"] == seed].sort_values("step")
        stages = detect_stages(
            mine["step"],
            mine["loss"],
            num_answers=table.num_answers,
            answers_per_relation=config.answers_per_relation,
            relation_loss=mine["relation_loss"],
        )
        rows.append(stamp(_stage_row(seed, stages, table, result.seconds) | settings))
    curves = pd.DataFrame([stamp(row) for row in curves.to_dict("records")])
    return curves, pd.DataFrame(rows)


def _stage_row(seed: int, stages: Stages, table: FactTable, seconds: float) -> dict[str, Any]:
    return {
        "seed": seed,
        **stages.boundaries(),
        "uniform_level": math.log(table.num_answers),
        "uniform_mean": stages.uniform.mean if stages.uniform else None,
        "hallucination_level": math.log(table.answers_per_relation),
        "hallucination_mean": stages.hallucination.mean if stages.hallucination else None,
        "hallucination_confirmed": stages.hallucination_confirmed,
        "relation_loss_mid": stages.relation_loss_mid,
        "seconds": round(seconds, 3),
    }



KEY_DEFAULTS = {"config": DynamicsConfig}  # a unit's key leaves the config's defaults out

def dynamics_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Sweep unit: one run of every seed; returns the stage rows, writes the curves beside them."""
    config = DynamicsConfig(**{k: tuple(v) if k == "seeds" else v for k, v in unit["config"].items()})
    curves, stages = run_dynamics(config, progress=False)
    key = unit_key(unit, KEY_DEFAULTS)
    write_table(curves, Path(unit["workdir"]) / "dynamics" / "curves" / f"{key}.csv", unit=key)
    return stages.to_dict("records")


def _report(frame: pd.DataFrame, out: Path, config: DynamicsConfig) -> str:
    from auditor.lab.common.search.summary import dynamics_markdown

    curves = pd.concat(
        [pd.read_csv(out / "dynamics" / "curves" / f"{key}.csv") for key in frame["unit"].unique()]
    )
    write_csv(curves, out / "dynamics_curves.csv")
    write_csv(frame, out / "dynamics_stages.csv")
    text = "## Learning stages\n\n" + dynamics_markdown(frame)
    write_text_atomic(out / "dynamics.md", text + "\n")
    return text


def _plots(frame: pd.DataFrame, out: Path, config: DynamicsConfig) -> list[Path]:
    from auditor.lab.common.search.plots import plot_dynamics

    return [plot_dynamics(pd.read_csv(out / "dynamics_curves.csv"), frame, out / "dynamics.png")]


STAGE_COLUMNS = (
    "seed",
    "uniform_end",
    "hallucination_start",
    "hallucination_end",
    "converged_at",
    "uniform_level",
    "uniform_mean",
    "hallucination_level",
    "hallucination_mean",
    "hallucination_confirmed",
    "relation_loss_mid",
    "seconds",
    "subjects",
    "relations",
    "answers_per_relation",
    "prompt_length",
    "init",
    "lr",
    "steps",
    "batch_size",
    "eval_every",
    "eval_contexts",
)
EXPERIMENT = Experiment(
    name="recall dynamics",
    help="Linear attention on one-hot embeddings: loss curves and the detected stages (step numbers).",
    config=DynamicsConfig,
    units=lambda config, out: [{"kind": "dynamics", "config": asdict(config), "workdir": str(out)}],
    run_unit=dynamics_unit,
    columns=STAGE_COLUMNS,
    plots=_plots,
    report=_report,
    presets={
        "quick": {
            "steps": 400,
            "batch_size": 128,
            "eval_every": 20,
            "eval_contexts": 4,
            "lr": 0.5,
            "seeds": (0,),
        },
        "reference": {"steps": 8192, "batch_size": 1024, "seeds": (0, 1, 2)},  # the paper's own setting
        "paper": {"steps": 8192, "batch_size": 1024, "seeds": (0, 1, 2, 3, 4)},
    },
    folder=lambda unit: "dynamics",
    key_defaults=KEY_DEFAULTS,
)
