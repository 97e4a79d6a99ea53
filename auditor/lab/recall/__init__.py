"""The recall room (``audit recall``): factual recall with one-layer transformers.

Files: ``task`` (fact tables and prompts) -> ``model`` (the one-layer transformer, attention-only or with an
MLP, as an ensemble) -> ``training`` (how those models train) -> one module per experiment: ``scaling``
(facts per parameter by bisection on S = R), ``tradeoff`` (the attention-versus-MLP grid) and ``dynamics``
with ``stages`` (linear attention on one-hot embeddings and the detected learning stages). Bisection,
convergence rule, summaries and plots come from the lab's shared layer (:mod:`auditor.lab.common.search`).
"""

from auditor.lab.room import Room

ROOM = Room(
    name="recall",
    help="Factual recall with one-layer transformers: facts stored per parameter (scaling), "
    "the attention-versus-MLP "
    "heat map (tradeoff), the learning stages (dynamics), or all three.",
    experiments={
        "scaling": "auditor.lab.recall.scaling:SCALING",
        "tradeoff": "auditor.lab.recall.tradeoff:TRADEOFF",
        "dynamics": "auditor.lab.recall.dynamics:EXPERIMENT",
    },
    suites={"all": ("scaling", "tradeoff", "dynamics")},
    bits="auditor.lab.recall.bits:READER",
)
