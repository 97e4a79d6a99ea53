"""The ``audit`` command line.

``audit MODEL [options]`` runs the assumption audit (the main job). The other tools are subcommands
(``audit compare``, ``audit models``), and so is every room of the capacity lab (``audit memorize``,
``audit facts width``, ...): the lab's rooms find themselves (:mod:`auditor.lab.room`), none is listed
here. Each subcommand lives beside the code it drives and is imported only when it is used; the listing
of ``audit --help`` reads the rooms' one-line help without importing their code.

User mistakes raise :class:`~auditor.core.errors.AuditError`; they are printed as one line and exit with
code 2. Any other exception, a ``ValueError`` included, is a bug and keeps its traceback (exit code 1).
"""

from __future__ import annotations

import importlib
import sys

import click

from auditor.core.errors import AuditError

# subcommand name -> "module:attribute" of a click.Command (the audit's tools; the lab's come from its rooms)
SUBCOMMANDS: dict[str, str] = {
    "models": "auditor.audit.model_list:models_command",
    "compare": "auditor.audit.compare:compare_command",
}
DEFAULT_COMMAND = "model"  # `audit vit-base ...` is `audit model vit-base ...`
_DEFAULT_TARGET = "auditor.audit.commands:audit_command"
# The one line `audit --help` lists for each of the audit's own commands, so the listing imports none of
# them (they import torch); tests/test_cli_speed.py holds each equal to its command's own short help.
SHORT_HELP: dict[str, str] = {
    DEFAULT_COMMAND: "Test the token assumptions of attention-memorization theory on MODEL.",
    "models": "List the registered model names (any hub id or timm:<name> works too), each with the context "
              "length n an audit with no options uses (text models: the cost rule of --context-length).",
    "compare": "Put audit reports side by side: what each measured (model, data, N, n, d, weights, skipped "
               "rows), one table of statements, fractions against their thresholds and critical rtol, and "
               "overlay figures.",
}


def _load(target: str) -> click.Command:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def _lab() -> dict[str, str]:
    """The lab's commands -> their one line of help: its own tools, then the rooms found on disk (none of
    their code imported)."""
    from auditor.lab import TOOLS
    from auditor.lab.room import rooms

    return {
        **{name: text for name, (_, text) in TOOLS.items()},
        **{name: room.help for name, room in rooms().items()},
    }


class _AuditGroup(click.Group):
    """A group whose unknown first word is the model name of the default ``model`` command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [DEFAULT_COMMAND, *SUBCOMMANDS, *_lab()]

    def _known(self, name: str) -> bool:
        return name == DEFAULT_COMMAND or name in SUBCOMMANDS or name in _lab()

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == DEFAULT_COMMAND:
            return _load(_DEFAULT_TARGET)
        if not self._known(name):
            return None
        try:
            if name in SUBCOMMANDS:
                return _load(SUBCOMMANDS[name])
            from auditor.lab.cli import lab_command

            return lab_command(name)
        except ModuleNotFoundError as err:  # an optional room whose dependencies are not installed
            reason = str(err)

            def unavailable() -> None:
                raise click.UsageError(f"'audit {name}' is not available in this installation ({reason})")

            return click.Command(name, callback=unavailable, help=f"(unavailable: {reason})")

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and not self._known(args[0]) and not args[0].startswith("-"):
            args = [DEFAULT_COMMAND, *args]
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command listing, by the declared one-line help of each command and room (so listing imports
    none of them)."""
        lab = _lab()
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            if name in lab or name in SHORT_HELP:
                text = lab.get(name) or SHORT_HELP[name]
                rows.append((name, click.Command(name, help=text).get_short_help_str(limit)))
            elif (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_AuditGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="attention-auditor")
def cli() -> None:
    """Test the token assumptions of attention-memorization theory on real models, and measure
    what attention layers memorize.

    \b
    Main job:   audit vit-base            (any name of `audit models`, a hub id, a folder or timm:<name>)
    Compare:    audit compare REPORT...   (report folders or model names: one table, overlay plots)
    Capacity:   audit memorize | certify | capacity
    Facts:      audit facts | assoc | recall
    Bits:       audit bits [REPORT...]    (stored bits per parameter across the lab's reports)
    Models:     audit models              (list the registered names)
    """


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``audit`` console script; returns the exit code."""
    try:
        cli.main(args=argv, prog_name="audit", standalone_mode=False)
    except click.exceptions.Abort as err:  # click turns Ctrl-C into Abort; keep what the runner said
        cause = err.__cause__
        detail = str(cause) if isinstance(cause, KeyboardInterrupt) and str(cause) else ""
        click.echo(f"interrupted: {detail}" if detail else "interrupted", err=True)
        return 130
    except click.ClickException as err:  # bad option values, unknown options: one line
        click.echo(f"error: {err.format_message()}", err=True)
        return 2
    except AuditError as err:  # the project's own user-error type only: any other error is a bug to show
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        click.echo(f"error: {msg}", err=True)
        return 2
    except OSError as err:  # a missing or unreadable file, a full disk, a read-only folder: one line too
        where = f": {err.filename}" if err.filename else ""
        click.echo(f"error: {err.strerror or type(err).__name__}{where}", err=True)
        return 2
    except KeyboardInterrupt as err:
        detail = str(err) or "finished rows are kept on disk; rerun the same command to resume a sweep"
        click.echo(f"interrupted: {detail}", err=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
