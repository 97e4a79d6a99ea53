"""The facts room (``audit facts``): fact databases as tensors, and how much one attention-only layer stores.

Flow: a :class:`~.database.FactDatabase` (CSV, DataFrame or :class:`~.database.DatabaseSpec` generator)
-> its tensor D and certified rank bounds (:mod:`.tensor`), exact rank for tiny cases (:mod:`.exact`), a
CP-rank estimate (:mod:`.cp`) and the effective rank (:mod:`.effective`) -> one attention-only layer over
[k, q] (:mod:`.model`, trained by the lab engine through :mod:`.training`) -> its layer tensor L and the
rank bound on it (:mod:`.layer_tensor`) -> the experiments with their presets (:mod:`.experiments`),
plots, and the tools ``audit facts generate`` and ``audit facts plot`` (:mod:`.tools`).
"""

from auditor.lab.room import Room

_EXPERIMENTS = "auditor.lab.facts.experiments"
ROOM = Room(
    name="facts",
    help="Fact databases as tensors (rank, bounds) and how much one attention-only layer memorizes.",
    experiments={
        "rank": f"{_EXPERIMENTS}:RANK",
        "train": f"{_EXPERIMENTS}:TRAIN_LAYERS",
        "width": f"{_EXPERIMENTS}:WIDTH",
        "budget": f"{_EXPERIMENTS}:BUDGET",
        "tau": f"{_EXPERIMENTS}:TAU",
        "bound": f"{_EXPERIMENTS}:BOUND",
        "measure": f"{_EXPERIMENTS}:MEASURE",
        "scale": f"{_EXPERIMENTS}:SCALE",
    },
    tools={"generate": "auditor.lab.facts.tools:generate_command", "plot": "auditor.lab.facts.tools:plot_command"},
    bits="auditor.lab.facts.bits:READER",
)
