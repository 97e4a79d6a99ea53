"""The facts room of the capacity lab: fact databases as tensors (Paper B).

Flow: a :class:`FactDatabase` (CSV, DataFrame or :class:`DatabaseSpec` generator) -> its tensor D and
certified rank bounds (:mod:`.tensor`), exact rank for tiny cases (:mod:`.exact`), a CP-rank estimate
(:mod:`.cp`) and the effective rank (:mod:`.effective`) -> one attention-only layer over [k, q]
(:mod:`.model`, trained by the lab engine through :mod:`.training`) -> its layer tensor L and the
rank bound on it (:mod:`.layer_tensor`) -> the experiments with their presets (:mod:`.experiments`)
and plots. The command line is ``audit facts`` (:mod:`.cli`).
"""

from auditor.lab.facts.cp import CPConfig, CPRankEstimate, estimate_cp_rank
from auditor.lab.facts.database import DatabaseSpec, FactDatabase, from_frame, from_indices, load_csv
from auditor.lab.facts.effective import EffectiveRank, effective_rank
from auditor.lab.facts.exact import ExactRank, exact_rank
from auditor.lab.facts.layer_tensor import (
    LayerBound,
    LayerTensor,
    architecture_bound,
    bound_decomposition,
    layer_tensor,
    threshold_database,
)
from auditor.lab.facts.model import FactLayer, LayerConfig
from auditor.lab.facts.tensor import RankBounds, dense_tensor, rank_bound, rank_bounds
from auditor.lab.facts.training import FactTask, train_layers

__all__ = [
    "CPConfig",
    "CPRankEstimate",
    "DatabaseSpec",
    "EffectiveRank",
    "ExactRank",
    "FactDatabase",
    "FactLayer",
    "FactTask",
    "LayerBound",
    "LayerConfig",
    "LayerTensor",
    "RankBounds",
    "architecture_bound",
    "bound_decomposition",
    "dense_tensor",
    "effective_rank",
    "estimate_cp_rank",
    "exact_rank",
    "from_frame",
    "from_indices",
    "layer_tensor",
    "load_csv",
    "rank_bound",
    "rank_bounds",
    "threshold_database",
    "train_layers",
]
