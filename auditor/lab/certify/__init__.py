"""The certify room (``audit certify``): capacity certificates of the memorize room's layer without
gradient descent (the rank of Z and the examples a least-squares readout provably memorizes)."""

from auditor.lab.room import Room

ROOM = Room(
    name="certify",
    help="Capacity certificate without gradient descent: the numerical rank of Z, "
    "the matrix whose row for example "
    "t stacks every head's attention-weighted context rows, and the examples a least-squares readout on Z "
    "provably memorizes.",
    experiments={"certify": "auditor.lab.certify.experiment:EXPERIMENT"},
    bits="auditor.lab.certify.bits:READER",
)
