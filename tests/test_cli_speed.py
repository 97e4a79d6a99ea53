"""`audit --help` and `audit models` answer without importing torch, transformers, pandas or probes (each
of those costs seconds on a shared 2-core machine), and what they print without them is what the commands
and the registry say."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from auditor.audit.model_list import MODELS
from auditor.audit.model_snapshot import registry_lines
from auditor.cli import _DEFAULT_TARGET, SHORT_HELP, SUBCOMMANDS, _load

HEAVY = ("torch", "transformers", "pandas", "probes", "matplotlib", "scipy")


@pytest.mark.parametrize("argv", [["--help"], ["models"]])
def test_the_listing_commands_import_nothing_heavy(argv):
    code = (
        "import sys\nfrom auditor.cli import main\n"
        f"assert main({argv!r}) == 0\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]


def test_the_declared_short_help_is_each_commands_own():
    targets = {"model": _DEFAULT_TARGET, **SUBCOMMANDS}
    assert set(SHORT_HELP) == set(targets)
    for name, target in targets.items():
        command = _load(target)
        assert click.Command(name, help=SHORT_HELP[name]).get_short_help_str(500) == \
            command.get_short_help_str(500), name


def test_the_models_snapshot_is_the_registry():
    assert registry_lines() == MODELS, "write it again: python -m auditor.audit.model_snapshot"
