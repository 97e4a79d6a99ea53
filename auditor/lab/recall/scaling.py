"""``audit recall scaling`` (deliverable 2 of capacity lab III): facts stored against parameters.

For every model size, the largest fact table that the model learns to at least ``threshold`` accuracy
over ALL S R facts, found by bisection on k = S + R with S = ceil(k / 2), R = floor(k / 2)
(:func:`table_shape`). The authors searched S = R; letting R trail S by one in between doubles the
resolution (facts grow by ~10% per step instead of ~20%). A model size is (d, H = attn_ratio d / d_h,
d_h, m = width_ratio d), so ``attn_ratio`` = H d_h / d and ``width_ratio`` = m / d (0 = attention-only).
One sweep unit is one d: its width ratios and seeds search in lock step, each round one ensemble. With
``budgets`` (step counts) the unit trains every table size of a grid once instead and reads the capacity
at each budget from the same runs (a run stopped at the threshold stops identically under any larger
budget).

Every row says whether it is ``converged`` (:mod:`.training`); a capacity whose next table was still
improving is the budget's, and fits leave it out. The sweep is in ``scaling/``, its rows also in
``facts.csv``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from auditor.core.atomic import write_text_atomic
from auditor.core.errors import AuditError
from auditor.lab.common.search.capacity import FACTS_PER_PARAMETER_GUIDE, Bisection, search_all
from auditor.lab.experiment import Experiment, option
from auditor.lab.recall.model import RecallMember, recall_parameters
from auditor.lab.recall.task import FactTable
from auditor.lab.recall.training import TRAINING_COLUMNS, RecallTraining, train_models, training_columns
from auditor.lab.sweep import field_defaults, write_csv


def _heads(d: int, attn_ratio: float, head_dim: int) -> int:
    heads = round(attn_ratio * d / head_dim)
    if heads < 1:
        raise AuditError(
            f"attn_ratio={attn_ratio} with d={d} and d_h={head_dim} gives "
            f"H = {attn_ratio * d / head_dim:.2f} "
            "heads; choose a larger ratio or a smaller d_h (H must be >= 1)"
        )
    return heads


@dataclass(frozen=True)
class ScalingConfig:
    """Facts stored against parameters (see the module docstring)."""

    dims: tuple[int, ...] = option((8, 12, 16, 24, 32), "Model widths d.", default_help="per scale")
    head_dim: int = 2
    attn_ratio: float = 1.0
    width_ratios: tuple[float, ...] = (0.0, 1.0)
    seeds: tuple[int, ...] = option((0, 1), "Seeds of the fact tables and models.", default_help="per scale")
    min_size: int = 4  # smallest k = S + R tried
    rel_tol: float = 0.0
    budgets: tuple[int, ...] = option(
        (),
        "Step budgets at which to read the capacity, e.g. 1000,2000,4096 (each a "
        "multiple of --eval-every, at most --steps). Given, every table size of the "
        "--grid trains once for --steps and no bisection runs.",
        default_help="none",
    )
    grid: tuple[float, ...] = option(
        (0.05, 0.2),
        "With --budgets: the table sizes tried, as a span of facts per "
        "parameter (every S + R from the lower to the upper end).",
    )
    training: RecallTraining = field(default=RecallTraining(), metadata={"nested": True})

    def __post_init__(self) -> None:
        object.__setattr__(self, "budgets", tuple(int(b) for b in self.budgets))
        object.__setattr__(self, "grid", tuple(float(g) for g in self.grid))
        if not self.dims or min(self.dims) < 2:
            raise AuditError(f"dims must be integers >= 2, got {self.dims}")
        steps, every = self.training.steps, self.training.eval_every
        bad = [b for b in self.budgets if not 1 <= b <= steps or b % every]
        if bad or len(set(self.budgets)) != len(self.budgets):
            raise AuditError(
                f"--budgets must be distinct multiples of --eval-every ({every}) no larger than --steps "
                f"({steps}); got {','.join(map(str, self.budgets))}"
            )
        if len(self.grid) != 2 or not 0 < self.grid[0] < self.grid[1]:
            raise AuditError(
                f"--grid takes two facts-per-parameter values, low < high (e.g. 0.05,0.2); got {self.grid}"
            )
        if self.head_dim < 1:
            raise AuditError(f"head_dim must be >= 1, got {self.head_dim}")
        if not self.width_ratios or min(self.width_ratios) < 0:
            raise AuditError(f"width ratios m/d must be >= 0 (0 = attention-only), got {self.width_ratios}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise AuditError(f"seeds must be distinct integers, got {self.seeds}")
        for d in self.dims:
            _heads(d, self.attn_ratio, self.head_dim)

    def units(self) -> list[dict[str, Any]]:
        base = dataclasses.asdict(self)
        base.pop("dims")
        return [{**base, "d": d} for d in self.dims]


def table_shape(k: int) -> tuple[int, int]:
    """(S, R) of search size k = S + R: S = ceil(k / 2), R = floor(k / 2), so S R grows monotonically."""
    if k < 2:
        raise AuditError(f"a fact table needs S + R >= 2, got {k}")
    return (k + 1) // 2, k // 2


def _scaling_members(unit: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(width, seed index, seed) of every search in a scaling unit."""
    d = unit["d"]
    return [(round(r * d), i, s) for r in unit["width_ratios"] for i, s in enumerate(unit["seeds"])]


def grid_sizes(parameters: int, grid: tuple[float, float], min_size: int = 4) -> list[int]:
    """Every search size k = S + R whose table spans ``grid`` (facts per parameter) for a model of
    ``parameters``: from floor(2 sqrt(low P)) to ceil(2 sqrt(high P)), as S R ~ k^2 / 4."""
    lo = max(min_size, math.floor(2 * math.sqrt(grid[0] * parameters)))
    return list(range(lo, max(lo + 1, math.ceil(2 * math.sqrt(grid[1] * parameters))) + 1))


def run_scaling_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Sweep unit: the largest table (k = S + R) learned by each (width, seed) at one d. One row per search
    (with budgets: one row per search and budget)."""
    if unit.get("budgets"):
        return _run_budget_unit(unit)
    tr = RecallTraining(**unit["training"])
    d, dh = int(unit["d"]), int(unit["head_dim"])
    heads = _heads(d, unit["attn_ratio"], dh)
    specs = _scaling_members(unit)
    searches = []
    for width, _, _ in specs:
        guess = 2 * math.sqrt(
            FACTS_PER_PARAMETER_GUIDE * recall_parameters(d, heads, dh, width)
        )  # k at the guide
        max_size = max(unit["min_size"] + 2, math.ceil(3 * guess))
        lo = max(unit["min_size"], min(max_size - 1, math.floor(0.6 * guess)))
        hi = max(lo + 1, min(max_size, math.ceil(1.0 * guess)))
        searches.append(Bisection(lo, hi, max_size=max_size, rel_tol=unit["rel_tol"]))
    probes: list[dict[str, Any]] = []

    def probe(pending: list[tuple[int, int]]) -> list[bool]:
        models = []
        for j, k in pending:
            width, _, seed = specs[j]
            table = FactTable(*table_shape(k), tr.answers_per_relation, seed=seed)
            models.append(RecallMember(d, heads, dh, width, table, seed=seed))
        outcomes = train_models(models, tr)
        for (j, k), outcome in zip(pending, outcomes):
            subjects, relations = table_shape(k)
            probes.append(
                {
                    "search": j,
                    "subjects": subjects,
                    "relations": relations,
                    "facts": subjects * relations,
                    **{
                        key: outcome[key]
                        for key in (
                            "accuracy",
                            "fact_recall",
                            "steps_trained",
                            "best_lr",
                            "passed",
                            "converged",
                        )
                    },
                }
            )
        return [o["passed"] for o in outcomes]

    t0 = time.perf_counter()
    rounds = search_all(searches, probe)
    seconds = time.perf_counter() - t0
    rows = []
    for j, ((width, _, seed), search) in enumerate(zip(specs, searches)):
        first_fail = [p for p in probes if p["search"] == j and p["subjects"] + p["relations"] == search.hi]
        rows.append(_capacity_row(
            d, heads, dh, width, seed, table_shape(search.capacity) if search.capacity >= 2 else (0, 0), tr,
            first_fail_facts=math.prod(table_shape(search.hi)) if search.hi <= search.max_size else None,
            budget=tr.steps, converged=bool(first_fail and first_fail[0]["converged"]), rounds=rounds,
            probes=[p for p in probes if p["search"] == j], seconds=seconds))
    return rows


def _run_budget_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Budget mode: every (width, seed) at every grid size trains once, as ONE ensemble, for ``steps``;
    the capacity at a budget B is the largest grid table that every smaller grid table also reached by
    step B. ``converged`` says the next table up had stopped improving by B (a capacity at the top of
    the grid, or below its bottom, is not converged: the grid did not bracket it)."""
    tr = RecallTraining(**unit["training"])
    d, dh = int(unit["d"]), int(unit["head_dim"])
    heads = _heads(d, unit["attn_ratio"], dh)
    budgets = tuple(sorted(unit["budgets"]))
    specs = _scaling_members(unit)
    grids = [grid_sizes(recall_parameters(d, heads, dh, width), tuple(unit["grid"]), unit["min_size"])
             for width, _, _ in specs]
    cells = [(j, k) for j, grid in enumerate(grids) for k in grid]
    models = [RecallMember(d, heads, dh, specs[j][0], FactTable(*table_shape(k), tr.answers_per_relation,
                                                                seed=specs[j][2]), seed=specs[j][2])
              for j, k in cells]
    t0 = time.perf_counter()
    outcomes = train_models(models, tr, budgets)
    seconds = time.perf_counter() - t0
    rows = []
    for j, (width, _, seed) in enumerate(specs):
        mine = [(k, o) for (i, k), o in zip(cells, outcomes) if i == j]  # ascending k
        for budget in budgets:
            fails = [n for n, (_, o) in enumerate(mine) if not o[budget]["passed"]]
            first = fails[0] if fails else None
            k = mine[first - 1][0] if first else (mine[-1][0] if first is None else 0)
            tried = [
                {
                    "subjects": table_shape(kk)[0],
                    "relations": table_shape(kk)[1],
                    "facts": math.prod(table_shape(kk)),
                    **{key: o[budget][key] for key in _BUDGET_PROBE},
                }
                for kk, o in mine
            ]
            rows.append(_capacity_row(
                d, heads, dh, width, seed, table_shape(k) if k else (0, 0), tr,
                first_fail_facts=math.prod(table_shape(mine[first][0])) if first is not None else None,
                budget=budget, converged=bool(first and mine[first][1][budget]["converged"]), rounds=1,
                probes=tried, seconds=seconds))
    return rows


_BUDGET_PROBE = ("accuracy", "steps_trained", "best_lr", "passed", "converged")  # what a budget probe keeps


def _capacity_row(d: int, heads: int, dh: int, width: int, seed: int, shape: tuple[int, int],
                  tr: RecallTraining, *, first_fail_facts: int | None, budget: int, converged: bool,
                  rounds: int, probes: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """The row of one (width, seed) whose capacity is the fact table of ``shape`` (subjects, relations;
    (0, 0): none), in both modes of the scaling experiment."""
    subjects, relations = shape
    params = recall_parameters(d, heads, dh, width)
    facts = subjects * relations
    bits_per_fact = math.log2(tr.answers_per_relation)
    return {
        "d": d,
        "heads": heads,
        "head_dim": dh,
        "width": width,
        "architecture": "attention-only" if width == 0 else "attention+mlp",
        "parameters": params,
        "parameters_with_bias": params + width,
        "seed": seed,
        "subjects": subjects,
        "relations": relations,
        "facts": facts,
        "first_fail_facts": first_fail_facts,
        "bits": facts * bits_per_fact,
        "facts_per_parameter": facts / params,
        "bits_per_parameter": facts * bits_per_fact / params,
        "budget": budget,
        "converged": converged,
        "rounds": rounds,
        "probes": probes,
        **training_columns(tr),
        "seconds": round(seconds, 3),
    }


SCALING_COLUMNS = (
    "d",
    "heads",
    "head_dim",
    "width",
    "architecture",
    "parameters",
    "parameters_with_bias",
    "seed",
    "subjects",
    "relations",
    "facts",
    "first_fail_facts",
    "bits",
    "facts_per_parameter",
    "bits_per_parameter",
    "budget",
    "converged",
    "rounds",
    "probes",
    *TRAINING_COLUMNS,
    "seconds",
)


# a unit holds its config's fields (the training nested): its key leaves their defaults out
SCALING_KEYS = {**field_defaults(ScalingConfig), "training": RecallTraining}


# Named scales. The paper: d in 2^{3..7.5}, 16384 steps of 1024 fresh prompts, the best of lr in {1e-3, 3e-3,
# 1e-2}; at the reference's 16x smaller budget larger steps pay off, so it takes the best of {1e-2, 3e-2}.
_PAPER_DIMS = (8, 11, 16, 22, 32, 45, 64, 90, 128, 181)
_SCALING = {"head_dim": 2, "attn_ratio": 1.0, "width_ratios": (0.0, 1.0)}
SCALING_PRESETS = {
    "quick": {
        **_SCALING,
        "dims": (8,),
        "seeds": (0,),
        "training": {"steps": 100, "batch_size": 256, "lrs": (1e-2, 3e-2)},
    },
    "reference": {
        **_SCALING,
        "dims": (8, 11, 16, 23),
        "seeds": (0, 1, 2),
        "training": {"steps": 1000, "batch_size": 256, "lrs": (1e-2, 3e-2)},
    },
    "paper": {
        **_SCALING,
        "dims": _PAPER_DIMS,
        "seeds": (0, 1, 2),
        "training": {"steps": 16384, "batch_size": 1024, "lrs": (1e-3, 3e-3, 1e-2)},
    },
}


def _scaling_report(frame: pd.DataFrame, out: Path, config: ScalingConfig) -> str:
    from auditor.lab.common.search.summary import budget_markdown, facts_markdown

    write_csv(frame, out / "facts.csv")
    text = "## Facts against parameters\n\n" + facts_markdown(frame)
    if frame["budget"].nunique() > 1:
        text += "\n\n## Facts per parameter against the step budget\n\n" + budget_markdown(frame)
    write_text_atomic(out / "scaling.md", text + "\n")
    return text


def _scaling_plots(frame: pd.DataFrame, out: Path, config: ScalingConfig) -> list[Path]:
    from auditor.lab.common.search import plots

    paths = [plots.plot_facts(frame, out / "facts.png")]
    if frame["budget"].nunique() > 1:
        paths.append(plots.plot_budget(frame, out / "budget.png"))
    return paths


SCALING = Experiment(
    name="recall scaling",
    help="Facts stored (the largest S x R table at 99% over all facts; bisection on S + R) "
    "against parameters, "
    "with the fitted facts per parameter and bits per parameter.",
    config=ScalingConfig,
    units=lambda config, out: config.units(),
    run_unit=run_scaling_unit,
    columns=SCALING_COLUMNS,
    plots=_scaling_plots,
    report=_scaling_report,
    presets=SCALING_PRESETS,
    folder=lambda unit: "scaling",
    key_defaults=SCALING_KEYS,
)
