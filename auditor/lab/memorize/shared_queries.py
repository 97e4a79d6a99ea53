"""``audit memorize shared-queries``: memorization when every example asks from one shared query set.

The dual of the memorize room's shared-context setting: Q query vectors are drawn once and example t asks
query ``t mod Q`` (Q = 1: all examples ask the same query), while every example has a context E(t) of its
own (n rows of width d) and its own random class label. What tells examples apart is then their contexts,
seen through the attention each head pays them; the layer, the trainer (rounds to convergence) and the
measurements (memorized, accuracy = memorized fraction, rank certificates, saturation) are those of
``audit memorize`` (:mod:`auditor.lab.common.mha.train`), with data drawn by :func:`shared_query_data`.

One sweep unit is one bucket of runs at one Q; rows are memorize's plus ``queries`` (Q) and
``shared_queries``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from auditor.core.errors import AuditError
from auditor.lab.common.mha import plots, train
from auditor.lab.common.mha.data import DataConfig, MemorizeData, derived_seed
from auditor.lab.common.mha.train import MemorizeRun, MemorizeSettings, grid, make_units
from auditor.lab.experiment import Experiment, option, table
from auditor.lab.memorize.experiment import ROUNDS_HELP, settings_option, training_settings
from auditor.lab.stats import intervals, mean_ci
from auditor.lab.sweep import write_table


def shared_query_data(config: DataConfig, queries: int) -> MemorizeData:
    """The classification dataset of ``config`` with ``queries`` shared queries: Q queries, then N contexts,
    then N labels, from one generator seeded by ``config.seed``; example t asks query t mod Q."""
    if not 1 <= queries <= config.N:
        raise AuditError(f"queries (Q) must be in 1..N = {config.N}, got {queries}")
    g = torch.Generator().manual_seed(derived_seed(config.seed, "shared-queries data"))
    query_set = torch.rand(queries, config.d, generator=g)  # (Q, d)
    contexts = torch.rand(config.N, config.context, config.d, generator=g)  # (N, n, d)
    labels = torch.randint(config.classes, (config.N,), generator=g)  # (N,)
    asked = query_set[torch.arange(config.N) % queries]  # (N, d)
    return MemorizeData(contexts, asked, labels, "classification", config.classes)


@dataclass(frozen=True)
class SharedQueriesConfig:
    """What ``audit memorize shared-queries`` runs: the grid, the query-set sizes Q and the training."""

    heads: tuple[int, ...] = option((1, 2, 4, 8), "H values, e.g. 1,2,4 or 1:8.")
    context: tuple[int, ...] = option((8,), "n values (context rows of every example).")
    d_h: tuple[int, ...] = option((16,), "Key/query widths d_h.")
    N: tuple[int, ...] = option((512,), "Dataset sizes N.", flag="--N")
    queries: tuple[int, ...] = option(
        (1, 8), "Sizes Q of the shared query set (example t asks query t mod Q); each in 1..N."
    )
    seeds: tuple[int, ...] = option(
        (0, 1, 2), "Seeds (data and initialisation); means carry 95% t intervals."
    )
    d: int = option(16, "Token width d.")
    classes: int = option(100, "Random label classes.")
    steps: int = option(2000, "Optimisation steps per round (one warm-up + cosine cycle).")
    lr: float = option(1e-2, "Peak Adam learning rate.", parse="floats")
    batch_size: int = option(512, "Minibatch size; N <= batch trains full-batch.")
    eval_every: int = option(50, "Full-set accuracy (early stop) every k steps.")
    rounds: int = settings_option("rounds", ROUNDS_HELP)
    plateau: float = settings_option("plateau")
    bucket_size: int = settings_option("bucket_size")
    certify: bool = settings_option("certify")
    device: str = settings_option("device")

    def __post_init__(self) -> None:
        bad = [q for q in self.queries if not 1 <= q <= min(self.N)]
        if bad:
            raise AuditError(f"--queries takes sizes in 1..{min(self.N)} (the smallest --N); got {bad[0]}")
        self.settings()  # steps, lr, rounds, plateau, device: checked here, before any folder exists
        self.runs()  # H, n, d_h, N, d, classes

    def settings(self) -> MemorizeSettings:
        return training_settings(self)

    def runs(self) -> list[MemorizeRun]:
        return grid(self.heads, self.context, self.d_h, self.N, self.seeds, d=self.d, classes=self.classes,
                    shared_context=False)


def _units(config: SharedQueriesConfig, out: Path) -> list[dict[str, Any]]:
    """The memorize room's buckets, once per Q (the unit names its Q)."""
    settings, runs = config.settings(), config.runs()
    return [{**unit, "kind": "memorize-shared-queries", "queries": q}
            for q in config.queries for unit in make_units(runs, settings, out)]


def run_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Train one bucket on shared-query data; one row per run (memorize's row plus ``queries``)."""
    q = int(unit["queries"])
    rows = train.run_unit(unit, make=lambda data: shared_query_data(data, q))
    return [{**row, "queries": q, "shared_queries": True} for row in rows]


_GROUP = ["queries", "context", "d_h", "N", "heads"]


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (Q, n, d_h, N, H), over the converged seeds: memorized mean with its 95% t interval, the mean
    memorized fraction, the lower bound, ``seeds`` (converged) and ``runs``."""
    rows = []
    for key, part in frame.groupby(_GROUP):
        done = plots.converged_rows(part)
        mean, low, high = mean_ci(done["memorized"])
        rows.append(
            {
                **dict(zip(_GROUP, key)),
                "memorized_mean": mean,
                "memorized_low": low,
                "memorized_high": high,
                "memorized_fraction": float(done["accuracy"].mean()) if len(done) else float("nan"),
                "lower_bound": part["lower_bound"].iloc[0],
                "seeds": len(done),
                "runs": len(part),
            }
        )
    return pd.DataFrame(rows)


def _report(frame: pd.DataFrame, out: Path, config: SharedQueriesConfig) -> str:
    summary = summarize(frame)
    write_table(
        summary,
        out / "summary.csv",
        device=str(frame["device"].iloc[0]),
        seed=",".join(map(str, config.seeds)),
    )
    shown = summary.assign(memorized=intervals(summary, "memorized_mean", "memorized_low", "memorized_high"))
    text = (
        "Memorized examples with Q shared queries, mean [95% t interval] over the converged seeds, and the "
        "memorized fraction; seeds = converged of runs:\n\n"
        + table(shown, [*_GROUP, "memorized", "memorized_fraction", "lower_bound", "seeds", "runs"])
    )
    stopped = frame[~frame["converged"].astype(bool)]
    if len(stopped):
        text += "\n\nStopped at the step limit (raise --steps or --rounds):\n\n" + table(
            stopped, ["queries", "heads", "context", "d_h", "N", "seed", "memorized", "rounds_trained"])
    return text + f"\n\nresults: {out / 'results.csv'}; summary: {out / 'summary.csv'}"


def _plots(frame: pd.DataFrame, out: Path, config: SharedQueriesConfig) -> list[Path]:
    """Memorized against H, one figure per (Q, n, d_h), drawn like ``audit memorize``'s."""
    paths = []
    for (q, n, d_h), part in frame.groupby(["queries", "context", "d_h"]):
        paths.append(out / f"memorized_vs_heads_q{q}_n{n}_dh{d_h}.png")
        plots.plot_sweep(part, "heads", paths[-1], title=f"Q = {q} shared queries, n = {n}, d_h = {d_h}: "
                                                         "memorized against H")
    return paths


EXPERIMENT = Experiment(
    name="memorize shared-queries",
    help="Memorization when all examples share one query set and differ in their contexts and labels; "
    "sweep H, "
    "n, d_h, N, the query-set size Q and seeds.",
    examples="audit memorize shared-queries --scale quick\n"
    "audit memorize shared-queries --heads 1:8 --queries 1,4,16 --N 256 --seeds 0,1",
    config=SharedQueriesConfig,
    units=_units,
    run_unit=run_unit,
    columns=(*train.COLUMNS, "queries", "shared_queries"),
    plots=_plots,
    report=_report,
    presets={
        "quick": {
            "heads": (1, 2),
            "context": (4,),
            "d_h": (8,),
            "N": (64,),
            "queries": (1, 4),
            "d": 8,
            "seeds": (0,),
            "steps": 100,
            "batch_size": 64,
            "eval_every": 20,
            "rounds": 2,
        }
    },
    key_defaults=train.KEY_DEFAULTS,  # memorize's units plus Q: their key leaves the same defaults out
)
