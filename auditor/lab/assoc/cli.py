"""``audit assoc`` (associative-memory capacity) and ``audit recall`` (factual recall), built from their
experiments by :mod:`auditor.lab.cli`."""

from auditor.lab.cli import command, room

assoc_command = command("assoc")
recall_command = room("recall", "Factual recall with one-layer transformers: facts stored per parameter "
                      "(scaling), the attention-versus-MLP heat map (tradeoff), the learning stages (dynamics), "
                      "or all three.")
