"""The capacity room (``audit capacity``): the memorize room's layer trained on a real model's tokens,
beside the assumption verdicts of the same tokens."""

from auditor.lab.room import Room

ROOM = Room(
    name="capacity",
    help="Memorization on real representations, trained to convergence over several seeds, "
    "beside the lower bound "
    "H(min(n, d_h)-1)+1 and the Assumption 1/2 verdicts of the same tokens.",
    experiments={"capacity": "auditor.lab.capacity.experiment:EXPERIMENT"},
    bits="auditor.lab.capacity.bits:READER",
)
