"""The contract every room and every capacity experiment honours, tested over the rooms found on disk.

Every room is a folder of ``auditor/lab`` named as its command, declaring its experiments, suites, tools
and bits reader; a new folder is a new command with nothing edited elsewhere. Every experiment declares a
frozen config whose options all have help, a ``quick`` preset that runs, and a row schema; every lab
command takes the same common options with the same meaning and reads lists the same way; old spellings
still work with a one-line notice; every CSV a run writes carries the provenance columns; and no module of
the package imports another in a cycle.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
import textwrap
import typing
from pathlib import Path

import click
import pandas as pd
import pytest
import torch

import auditor.lab
from auditor.cli import cli, main
from auditor.lab import room as registry
from auditor.lab.cli import parse
from auditor.lab.room import BitsReader, Room
from auditor.lab.sweep import PROVENANCE

pytestmark = pytest.mark.usefixtures("one_thread")

ROOMS = sorted(registry.rooms())
NAMES = sorted(registry.experiments())
COMMANDS = sorted([*registry.experiments(), *registry.suites()])
TOOLS = {room.full(t) for room in registry.rooms().values() for t in room.tools}  # around the experiments
COMMON = {
    "--scale": "reference",
    "--seeds": None,
    "--out": None,
    "--executor": "local",
    "--address": None,
    "--threads": None,
    "--plots": True,
    "--slurm-partition": None,
    "--slurm-time": "60",
    "--slurm-cpus": 1,
    "--slurm-gpus": 0,
    "--slurm-parallel": None,
}
SLOW = {"facts measure", "facts scale", "assoc", "recall scaling"}  # their quick runs take 7-25 s


def lab_commands() -> dict[str, click.Command]:
    """Every lab command, found by walking ``audit``'s own command tree."""
    ctx = click.Context(cli)
    out = {}
    for name, room in registry.rooms().items():
        command = cli.get_command(ctx, name)
        if name in room.experiments:
            out[name] = command
        if isinstance(command, click.Group):
            out.update({room.full(n): command.get_command(ctx, n) for n in command.list_commands(ctx)})
    return out


def test_the_command_tree_is_the_registry():
    assert set(lab_commands()) == set(COMMANDS) | TOOLS
    listed = cli.list_commands(click.Context(cli))
    assert set(ROOMS) <= set(listed) and "bits" in listed
    assert len(listed) == len(set(listed)), (
        "a room named like another command of `audit` would be hidden by it"
    )


def test_the_rooms_are_the_lab_folders():
    """Every package of the lab is a room, except the shared layer the rooms import."""
    folders = sorted(
        p.name for p in Path(auditor.lab.__file__).parent.iterdir() if (p / "__init__.py").is_file()
    )
    assert folders == sorted([*ROOMS, registry.SHARED])
    assert {"memorize", "certify", "capacity", "facts", "assoc", "recall"} <= set(ROOMS)


@pytest.mark.parametrize("name", ROOMS)
def test_every_room_declares_its_help_experiments_and_bits_reader(name):
    room = registry.rooms()[name]
    assert room.name == name and room.help.strip()
    assert all(registry.get(room.full(e)).name == room.full(e) for e in room.experiments)
    assert room.bits is None or isinstance(registry.load(room.bits), BitsReader)
    assert all(isinstance(registry.load(t), click.Command) for t in room.tools.values())


def test_a_room_refuses_duplicate_names_and_unknown_suite_members():
    with pytest.raises(ValueError, match="twice"):
        Room("toy", "help", {"a": "m:A"}, suites={"a": ("a",)})
    with pytest.raises(ValueError, match="did you mean 'alpha'"):
        Room("toy", "help", {"alpha": "m:A"}, suites={"all": ("alpah",)})
    with pytest.raises(ValueError, match="module:attribute"):
        Room("toy", "help", {"a": "no_colon"})
    with pytest.raises(ValueError, match="did you mean 'memorize'"):
        registry.get_room("memorise")


_TOY_ROOM = """
from dataclasses import dataclass

from auditor.lab.experiment import Experiment, option
from auditor.lab.room import Room


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...] = option((1, 2, 3), "Sizes.")


def square(unit):
    return {"size": unit["size"], "square": unit["size"] ** 2}


EXPERIMENT = Experiment(name="toyroom", help="Squares of sizes.", config=Config,
                        units=lambda config, out: [{"size": s} for s in config.sizes], run_unit=square,
                        columns=("size", "square"), presets={"quick": {"sizes": (2, 5)}})
ROOM = Room(name="toyroom", help="A room made of one folder.",
            experiments={"toyroom": "auditor.lab.toyroom:EXPERIMENT"})
"""


def test_a_new_room_is_one_folder_and_nothing_edited_elsewhere(tmp_path, monkeypatch, capsys):
    (tmp_path / "toyroom").mkdir()
    (tmp_path / "toyroom" / "__init__.py").write_text(textwrap.dedent(_TOY_ROOM))
    monkeypatch.setattr(auditor.lab, "__path__", [*auditor.lab.__path__, str(tmp_path)])  # importable
    monkeypatch.setattr(registry, "FOLDERS", [*registry.FOLDERS, str(tmp_path)])  # and found
    registry.rooms.cache_clear()
    try:
        assert "toyroom" in registry.rooms()
        assert main(["--help"]) == 0 and "A room made of one folder." in capsys.readouterr().out
        assert main(["toyroom", "--scale", "quick", "--no-plots", "--out", str(tmp_path / "run")]) == 0
        assert pd.read_csv(tmp_path / "run" / "results.csv")["square"].tolist() == [4, 25]
    finally:
        monkeypatch.undo()
        registry.rooms.cache_clear()
        sys.modules.pop("auditor.lab.toyroom", None)
    assert "toyroom" not in registry.rooms()


@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_declares_the_contract(name):
    experiment = registry.get(name)
    assert experiment.name == name and experiment.help and experiment.columns
    assert dataclasses.is_dataclass(experiment.config) and experiment.config.__dataclass_params__.frozen
    assert len(set(experiment.columns)) == len(experiment.columns)
    assert not set(experiment.columns) & set(PROVENANCE[2:]), "the runner stamps git_commit and versions"
    assert {"quick", "reference"} <= set(experiment.scales)
    for option in experiment.options():
        assert option.field.metadata["help"].strip(), option.field.name
    assert (
        callable(experiment.run_unit) and experiment.run_unit.__qualname__ == experiment.run_unit.__name__
    ), "the unit function must be module level (Ray ships it by reference)"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_lab_command_takes_the_common_options_with_one_meaning(name):
    command = lab_commands()[name]
    options = {opt: p for p in command.params for opt in p.opts}
    for flag, default in COMMON.items():
        assert flag in options, f"{name} lacks {flag}"
        assert options[flag].default == default, (name, flag)
    assert "--no-plots" in options["--plots"].secondary_opts
    assert list(options["--executor"].type.choices) == ["local", "ray", "slurm"]
    assert options["--seeds"].type == click.STRING  # a list, read by parse_seeds: commas and ranges
    reference = {opt: p for p in lab_commands()["memorize"].params for opt in p.opts}
    for flag in set(COMMON) - {
        "--scale",
        "--seeds",
    }:  # --scale lists each command's scales, --seeds its seeds
        assert options[flag].help == reference[flag].help, (name, flag)


@pytest.mark.parametrize("name", TOOLS)
def test_the_tools_take_threads(name):
    assert any(p.opts == ["--threads"] for p in lab_commands()[name].params)


@pytest.mark.parametrize("name", NAMES)
def test_every_list_option_reads_commas_and_ranges(name):
    experiment = registry.get(name)
    for option in experiment.options():
        hint = typing.get_type_hints(option.owner)[option.field.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        kind = args[0] if args and typing.get_origin(hint) is not tuple else hint
        if typing.get_origin(kind) is tuple and typing.get_args(kind)[0] is int:
            assert parse(option, "1:3,5") == (1, 2, 3, 5), option.field.name
        elif typing.get_origin(kind) is tuple and typing.get_args(kind)[0] is float:
            assert parse(option, "1e-2,3e-2") == (1e-2, 3e-2), option.field.name


# -- spellings of 0.1 are gone: a one-line error, no folder ---------------------------------------
@pytest.mark.parametrize("args", [
    ["memorize", "--tolerance", "0.1"], ["memorize", "--scale", "cpu"], ["facts", "width", "--quick"],
    ["facts", "width", "--no-plot"], ["facts", "sweep", "width"], ["facts", "width", "--init-seeds", "0"],
    ["certify", "--train-steps", "1"], ["capacity", "--representation", "block.0"],
], ids=lambda v: " ".join(v[1:]))
def test_retired_spellings_are_refused_in_one_line(args, tmp_path, capsys):
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert not (tmp_path / "out").exists()


def test_seeds_on_an_experiment_without_seeds_is_one_clear_line(tmp_path, capsys):
    assert main(["facts", "measure", "--seeds", "0", "--out", str(tmp_path / "m")]) == 2
    assert "facts measure has nothing to seed" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


# -- a quick run of every experiment: results, provenance on every CSV ---------------------------------
def _inputs(name: str, folder: Path) -> list[str]:
    """The arguments an experiment needs besides its options: a token file or a database."""
    if name == "capacity":
        from auditor.audit.tokens import Tokens

        contexts = torch.randn(24, 6, 8, generator=torch.Generator().manual_seed(0))  # (N, n, d)
        Tokens(contexts, contexts[:, 0].clone(), {"model": "synthetic", "representation": "block.0",
                                                 "query_index": "0"}).save(folder / "block.0.safetensors")
        return ["--tokens", str(folder / "block.0.safetensors")]
    if name in ("facts rank", "facts train"):
        assert main(["facts", "generate", "--keys", "6", "--queries", "3", "--values-per-query", "2", "-o",
                     str(folder / "db.csv")]) == 0
        return [str(folder / "db.csv")]
    return []


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in NAMES])
def test_every_experiment_runs_at_quick_scale_and_stamps_every_csv(name, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*name.split(), *_inputs(name, tmp_path), "--scale", "quick", "--out", str(out)]) == 0
    capsys.readouterr()
    experiment = registry.get(name)
    results = sorted(out.rglob("results.csv"))
    assert results, "a run writes results.csv"
    for path in results:
        frame = pd.read_csv(path)
        assert len(frame) and set(frame.columns) <= {*experiment.columns, *PROVENANCE, "unit", "unit_config"}
        assert frame["unit"].notna().all() and frame["unit_config"].notna().all()
    for path in [*out.rglob("*.csv"), *tmp_path.glob("*.csv")]:
        frame = pd.read_csv(path)
        missing = [c for c in PROVENANCE if c not in frame]
        assert not missing, f"{path.relative_to(tmp_path)} lacks {missing}"
        assert frame["git_commit"].notna().all() and frame["device"].notna().all()


# -- no import cycles ---------------------------------------------------------------------------------
PACKAGE = Path(__file__).resolve().parents[2] / "auditor"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules ``path`` imports when it is imported (module level, TYPE_CHECKING left out)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.If | ast.Try):
                visit([*node.body, *node.orelse, *[s for h in getattr(node, "handlers", []) for s in h.body]])
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.update(
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                )

    visit(ast.parse(path.read_text()).body)
    return found & modules


def test_no_module_imports_another_in_a_cycle():
    paths = {_module(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(paths)) for name, path in paths.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def walk(name: str, stack: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target):], target])
            elif target not in state:
                walk(target, [*stack, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not cycles, [" -> ".join(c) for c in cycles]
    # shared by the audit and the lab, depends on neither (auditor.core.slurm is its Slurm branch)
    assert not graph["auditor.core.execution"] - {"auditor.core.errors", "auditor.core.slurm"}
    assert not graph["auditor.core.slurm"] - {
        "auditor.core.errors",
        "auditor.core.atomic",
    }  # its job records: the safe writer
    assert not graph["auditor.core.atomic"] - {
        "auditor.core.errors"
    }  # every command's files: shared, depends on nothing
