"""The memorize room (``audit memorize``): how many examples multi-head attention memorizes.

Layout: ``data`` (the synthetic uniform-[0, 1) generator) -> ``model`` (the layer of the theory and the
authors' variant as a batched Ensemble) -> ``task`` (padding and masks so different H, n, d_h, N train
together) -> ``train`` (buckets on the shared engine, trained to convergence) -> ``certify`` (rank of Z,
least-squares readout, Proposition 2) and ``saturation`` -> ``plots``. The experiments: ``experiment``
(``audit memorize``, with the Figure 2 presets) and ``shared_queries`` (``audit memorize shared-queries``:
one query set for every example). The ``certify`` and ``capacity`` rooms build on this room's layer.
"""

from auditor.lab.room import Room

ROOM = Room(
    name="memorize",
    help="Train attention layers to memorize random labels; sweep H, n, d_h, N and seeds.",
    experiments={
        "memorize": "auditor.lab.memorize.experiment:EXPERIMENT",
        "shared-queries": "auditor.lab.memorize.shared_queries:EXPERIMENT",
    },
    bits="auditor.lab.memorize.bits:READER",
)
