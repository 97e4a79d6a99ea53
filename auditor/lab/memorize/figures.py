"""The sweeps of Paper A's Figure 2, at the paper's scale and at a CPU scale.

Figure 2 (classification, 100 classes, shared context, d = 64): (a) memorization against H at n = 32,
(b) against n at H = 20, (c) against d_h at H = 30, n = 32; several dataset sizes N per panel. The
``paper`` scale lists the paper's values and step rule (max(500 epochs, 50,000) steps, 300,000 for the
d_h panel, lr 1e-3, batch 256); it is meant for a GPU. The ``cpu`` scale keeps the design (shared
context, 100 classes, sweeps around n and d_h) with d = 16, n = 8, N in {512, 1024}, 2000 steps of
batch 512 and lr 1e-2, so the three panels run in minutes on two CPU cores.
"""

from __future__ import annotations

from dataclasses import dataclass

from auditor.errors import did_you_mean
from auditor.lab.memorize.train import MemorizeRun, MemorizeSettings, grid, paper_steps

FIGURES = ("a", "b", "c")
SCALES = ("cpu", "paper")


@dataclass(frozen=True)
class FigurePlan:
    """A panel of Figure 2: the runs, the training settings and the swept axis."""

    figure: str
    scale: str
    x: str  # "heads" | "context" | "d_h"
    runs: list[MemorizeRun]
    settings: MemorizeSettings
    note: str


def figure_plan(figure: str, scale: str = "cpu", seeds: tuple[int, ...] = (0,), **overrides) -> FigurePlan:
    """Runs and settings of panel ``figure`` at ``scale``; ``overrides`` replace settings fields."""
    if figure not in FIGURES:
        raise did_you_mean("figure", figure, FIGURES)
    if scale not in SCALES:
        raise did_you_mean("scale", scale, SCALES)
    if scale == "paper":
        d, n, common = 64, 32, {"classes": 100, "shared_context": True}
        axes = {
            "a": ("heads", dict(heads=[1, 5, 10, 20, 30, 40, 50, 60], context=[n], d_h=[d], N=[10_000, 20_000, 30_000, 40_000])),
            "b": ("context", dict(heads=[20], context=[1, 5, 10, 20, 30, 40, 50, 60], d_h=[d], N=[6000, 10_000, 14_000, 18_000])),
            "c": ("d_h", dict(heads=[30], context=[n], d_h=[10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 64], N=[10_000, 20_000])),
        }
        x, values = axes[figure]
        steps = 300_000 if figure == "c" else paper_steps(max(values["N"]))
        settings = MemorizeSettings(steps=steps, lr=1e-3, batch_size=256, eval_every=500, **overrides)
        note = f"paper scale: d = {d}, steps = {steps}, lr 1e-3, batch 256 (a GPU job)"
    else:
        d, n, common = 16, 8, {"classes": 100, "shared_context": True}
        axes = {
            "a": ("heads", dict(heads=[1, 2, 3, 4, 6, 8], context=[n], d_h=[d], N=[512, 1024])),
            "b": ("context", dict(heads=[4], context=[1, 2, 4, 6, 8, 12, 16], d_h=[d], N=[512, 1024])),
            "c": ("d_h", dict(heads=[6], context=[n], d_h=[1, 2, 4, 6, 8, 12, 16], N=[512, 1024])),
        }
        x, values = axes[figure]
        base = {"steps": 2000, "lr": 1e-2, "batch_size": 512, "eval_every": 50}
        settings = MemorizeSettings(**{**base, **overrides})
        note = (f"CPU scale: d = {d}, n = {n} (panel b sweeps n), 100 classes, shared context, N in {values['N']}, "
                f"{settings.steps} steps of batch {settings.batch_size} at lr {settings.lr} (the paper: d = 64, "
                "n = 32, N in the tens of thousands, >= 50,000 steps of batch 256 at lr 1e-3)")
    runs = grid(values["heads"], values["context"], values["d_h"], values["N"], seeds, d=d, **common)
    return FigurePlan(figure=figure, scale=scale, x=x, runs=runs, settings=settings, note=note)
