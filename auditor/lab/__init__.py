"""The capacity lab: how much an attention layer really memorizes.

Each room is a subpackage named as its command and registers itself (:mod:`auditor.lab.room`):
``memorize`` (multi-head attention memorization, Paper A), ``certify`` (its rank certificates without
training), ``capacity`` (its layer on a real model's tokens), ``facts`` (fact databases as tensors, Paper
B), ``assoc`` (associative memories, Paper C) and ``recall`` (factual recall, Paper C). They share one
batched training engine (:mod:`auditor.lab.engine`), one experiment contract and runner
(:mod:`auditor.lab.experiment`) over one resumable sweep runner that stamps the provenance
(:mod:`auditor.lab.sweep`, executing through :mod:`auditor.core.execution`), and one command-line layer
(:mod:`auditor.lab.cli`). ``audit bits`` (:mod:`auditor.lab.bits`) reads every room's results. A room
imports these shared modules and its own, never another room: what several rooms use lives below them in
:mod:`auditor.lab.common` (not a room).
"""

# lab commands that belong to no room (they read every room's results): name -> ("module:attribute", help)
TOOLS: dict[str, tuple[str, str]] = {
    "bits": (
        "auditor.lab.bits:bits_command",
        "Stored bits per trainable parameter of every room's results, with each row's formula.",
    ),
}
