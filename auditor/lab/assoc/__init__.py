"""The assoc room (``audit assoc``): the capacity of linear and MLP associative memories.

Files: ``memories`` (the memories as batched ensembles, the N-item task) -> ``capacity`` (bisection for
the largest stored size, power-law and guide-constant fits) -> ``experiment`` (sweeps over d, m/d and
seeds) -> ``summary`` and ``plots``. ``convergence`` holds the plateau rule. The recall room reuses the
bisection, the convergence rule, the summaries and the plots.
"""

from auditor.lab.room import Room

ROOM = Room(
    name="assoc",
    help="Capacity of linear and MLP associative memories: the largest N stored at 99% accuracy "
    "over all N items "
    "(bisection), swept over d (and m/d), with scaling-law fits against d^2 = 1.3 N ln N and "
    "m d = 0.35 N ln N.",
    experiments={"assoc": "auditor.lab.assoc.experiment:EXPERIMENT"},
    bits="auditor.lab.assoc.bits:READER",
)
