"""The facts room (``audit facts``): fact databases as tensors, and how much one attention-only layer stores.

Flow: a :class:`~.database.FactDatabase` (CSV, DataFrame or :class:`~.database.DatabaseSpec` generator)
-> its tensor D and certified rank bounds (:mod:`.tensor`), exact rank for tiny cases (:mod:`.exact`), a
CP-rank estimate (:mod:`.cp`) and the effective rank (:mod:`.effective`) -> one attention-only layer over
[k, q] (:mod:`.model`, trained by the lab engine through :mod:`.training`) -> its layer tensor L and the
rank bound on it (:mod:`.layer_tensor`) -> the experiments with their presets, one module each and named
as its command (:mod:`.width`, :mod:`.budget`, :mod:`.tau`, :mod:`.bound`, :mod:`.measure`, :mod:`.scale`,
:mod:`.rank`, :mod:`.train`; what they share: :mod:`.shared`), plots, and the tools ``audit facts
generate`` and ``audit facts plot`` (:mod:`.tools`).
"""

from auditor.lab.room import Room

ROOM = Room(
    name="facts",
    help="Fact databases as tensors (rank, bounds) and how much one attention-only layer memorizes.",
    experiments={
        "rank": "auditor.lab.facts.rank:RANK",
        "train": "auditor.lab.facts.train:TRAIN_LAYERS",
        "width": "auditor.lab.facts.width:WIDTH",
        "budget": "auditor.lab.facts.budget:BUDGET",
        "tau": "auditor.lab.facts.tau:TAU",
        "bound": "auditor.lab.facts.bound:BOUND",
        "measure": "auditor.lab.facts.measure:MEASURE",
        "scale": "auditor.lab.facts.scale:SCALE",
    },
    tools={
        "generate": "auditor.lab.facts.tools:generate_command",
        "plot": "auditor.lab.facts.tools:plot_command",
    },
    bits="auditor.lab.facts.bits:READER",
)
