"""The lm room (``audit lm``): how many bits a small GPT-style language model stores per parameter, measured
as Morris et al. (2025) do: uniform random token sequences (entropy known exactly), memorized bits = that
entropy - the model's log-loss in bits, swept over dataset size until it plateaus.

Files: ``model`` (the tiny GPT) -> ``experiment`` (the sweep over models, dataset sizes, seeds and
precisions, its report and figure) -> ``bits`` (how ``audit bits`` counts its rows).
"""

from auditor.lab.room import Room

ROOM = Room(
    name="lm",
    help="Bits per parameter of small GPTs memorizing uniform random token sequences (Morris et al.), "
    "float32 and bfloat16, beside the paper's 3.6 and 3.5.",
    experiments={"lm": "auditor.lab.lm.experiment:EXPERIMENT"},
    bits="auditor.lab.lm.bits:READER",
)
