"""Capacity lab III: associative memories and factual recall (paper C).

Files, in the order of the experiments:

- ``memories``: linear and MLP associative memories as batched ensembles (the N-item task).
- ``capacity``: bisection for the largest stored size, power-law and guide-constant fits.
- ``memory_sweep``: capacity sweeps over d (and m/d) and seeds (``audit assoc``).
- ``facts``: the factual recall task: fact tables and prompts.
- ``recall``: the one-layer transformer (attention-only / attention + MLP) as an ensemble.
- ``recall_sweep``: facts per parameter (bisection on S = R) and the attention-versus-MLP grid.
- ``dynamics`` and ``stages``: linear attention on one-hot embeddings and automatic stage detection.
- ``summary``, ``plots``, ``presets``, ``cli``: fits in Markdown, figures, named scales, commands.
"""

from auditor.lab.assoc.capacity import Bisection, fit_guide_constant, fit_power_law, search_all
from auditor.lab.assoc.dynamics import DynamicsConfig, run_dynamics
from auditor.lab.assoc.facts import FactBank, FactTable
from auditor.lab.assoc.memories import LinearMemory, MemoryMember, MLPMemory, build_memory
from auditor.lab.assoc.memory_sweep import AssocConfig, run_assoc
from auditor.lab.assoc.recall import RecallMember, RecallTransformer, build_recall
from auditor.lab.assoc.recall_sweep import (
    RecallTraining,
    ScalingConfig,
    TradeoffConfig,
    run_scaling,
    run_tradeoff,
)
from auditor.lab.assoc.stages import Stages, detect_stages

__all__ = [
    "AssocConfig",
    "Bisection",
    "DynamicsConfig",
    "FactBank",
    "FactTable",
    "LinearMemory",
    "MLPMemory",
    "MemoryMember",
    "RecallMember",
    "RecallTraining",
    "RecallTransformer",
    "ScalingConfig",
    "Stages",
    "TradeoffConfig",
    "build_memory",
    "build_recall",
    "detect_stages",
    "fit_guide_constant",
    "fit_power_law",
    "run_assoc",
    "run_dynamics",
    "run_scaling",
    "run_tradeoff",
    "search_all",
]
