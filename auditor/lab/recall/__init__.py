"""The recall room (``audit recall``): factual recall with one-layer transformers.

Files: ``task`` (fact tables and prompts) -> ``model`` (the one-layer transformer, attention-only or with an
MLP, as an ensemble) -> ``experiments`` (facts per parameter by bisection on S = R, and the
attention-versus-MLP grid) and ``dynamics`` with ``stages`` (linear attention on one-hot embeddings and the
detected learning stages). Bisection, convergence rule, summaries and plots come from the assoc room.
"""

from auditor.lab.room import Room

ROOM = Room(
    name="recall",
    help="Factual recall with one-layer transformers: facts stored per parameter (scaling), "
    "the attention-versus-MLP "
    "heat map (tradeoff), the learning stages (dynamics), or all three.",
    experiments={
        "scaling": "auditor.lab.recall.experiments:SCALING",
        "tradeoff": "auditor.lab.recall.experiments:TRADEOFF",
        "dynamics": "auditor.lab.recall.dynamics:EXPERIMENT",
    },
    suites={"all": ("scaling", "tradeoff", "dynamics")},
    bits="auditor.lab.recall.bits:READER",
)
