"""``audit memorize``, ``audit certify`` and ``audit capacity``, built from their experiments by
:mod:`auditor.lab.cli`."""

from auditor.lab.cli import command

memorize_command = command("memorize")
certify_command = command("certify")
capacity_command = command("capacity")
