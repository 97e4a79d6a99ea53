"""Layers only point down: the import graph of ``auditor`` and ``probes``, read from the source.

Every ``import`` statement counts, wherever it stands: at module level, inside a function (where cycles
hide, since they only bite when the function runs) and under ``if TYPE_CHECKING`` (a type that needs an
upward import is a type in the wrong module). An edge goes to the module named, or to the submodule
when ``from package import name`` names one. Importing ``a.b.c`` also runs ``a/__init__`` and
``a/b/__init__``, but those implied edges are left out: every module would otherwise sit in a cycle with
its package's ``__init__``.

Lazy references count too: a string ``"auditor.x.y:attr"`` in the source (a registry entry, a subcommand,
a room's experiment or bits reader) is an import that happens when it is used. Each must name a module
and a name bound at its top level, and each is an edge of the graph under the same rules.

The rules:
- no cycles among the modules of ``auditor`` and ``probes``, lazy references included;
- only the capacity lab (``auditor/lab``) and the command line's dispatcher (``auditor/cli.py``) import
  ``auditor.lab``: the audit, the data and the models never reach up into it;
- a room of the lab (``auditor/lab/<room>/__init__``) refers only to its own modules;
- a room's modules import the lab's shared modules and their own room, never another room, and the
  shared layer (``auditor/lab/*.py``, ``auditor/lab/common``) imports no room;
- ``probes`` is a library of its own and imports nothing from ``auditor``;
- the audit's report sits below its runner: it imports from ``auditor`` only itself and ``auditor.core``;
- token sources and extraction take the plan's parts, not the configuration;
- the floors of ``docs/layout.md`` only point down: core <- data <- models <- audit (the data never
  imports a model: what it needs of one is the protocol ``auditor.data.feed.Fed``);
- core, data and models import only public names of each other's modules;
- ``docs/layout.md`` names every module of ``probes`` and ``auditor``.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("auditor", "probes")

# Edges that close a cycle today, tolerated until their modules are fixed; each one points up or sideways.
# Remove an entry when its edge is gone (a test below fails while an entry names an edge that no longer
# exists); the list should end up empty.
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {
    # none: keep it that way (an entry here must name the edge and why it cannot go)
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    return {_module_name(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


def _owner(name: str) -> str | None:
    """The module of ``name``: itself, or the longest prefix that is a module (``a.b.attr`` -> ``a.b``)."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """(dotted name, line) of everything ``module`` imports, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import sub` imports the submodule pkg.sub
                names.append(
                    (f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base, node.lineno)
                )
    return names


@cache
def graph() -> dict[str, dict[str, int]]:
    """module -> {imported module of the packages: first line}."""
    edges: dict[str, dict[str, int]] = {}
    for module, path in modules().items():
        targets = edges.setdefault(module, {})
        for name, line in _imported_names(module, path):
            target = _owner(name)
            if target is not None and target != module:
                targets.setdefault(target, line)
    return edges


LAZY = re.compile(r"(?:auditor|probes)(?:\.\w+)+:\w+")  # "module:attribute", imported when used


@cache
def lazy_references() -> list[tuple[str, str, str, int]]:
    """(module holding the string, target module, attribute, line) of every lazy reference in the source."""
    found = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and LAZY.fullmatch(node.value):
                target, attr = node.value.split(":")
                found.append((module, target, attr, node.lineno))
    return found


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def with_lazy_edges(edges: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out = {a: dict(targets) for a, targets in edges.items()}
    for module, target, _, line in lazy_references():
        if target != module:
            out.setdefault(module, {}).setdefault(target, line)
    return out


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(component: list[str], edges: dict[str, dict[str, int]]) -> str:
    inside = [f"{a} -> {b} ({modules()[a].relative_to(REPO)}:{line})"
              for a in component for b, line in sorted(edges[a].items()) if b in component]
    return "; ".join(inside)


def test_the_graph_reader_sees_function_level_and_relative_imports(tmp_path):
    """The reader itself: a cycle closed by a function-level import, and one by a relative import,
    are found."""
    edges = {"p.a": {"p.b": 1}, "p.b": {"p.c": 1}, "p.c": {"p.a": 9}, "p.d": {"p.a": 1}}
    assert cycles(edges) == [["p.a", "p.b", "p.c"]]
    assert cycles({"p.a": {"p.b": 1}, "p.b": {}}) == []
    report = REPO / "auditor" / "audit" / "report" / "tables.py"
    names = {name for name, _ in _imported_names("auditor.audit.report.tables", report)}
    assert "auditor.audit.report.schema" in names  # `from auditor.audit.report.schema import ...`
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from . import sibling\n    from .. import up\n")
    assert [n for n, _ in _imported_names("auditor.audit.report.mod", source)] == [
        "auditor.audit.report",
        "auditor.audit",
    ]


def test_no_import_cycles_beyond_the_known_ones():
    edges = {a: {b: line for b, line in targets.items() if (a, b) not in KNOWN_CYCLE_EDGES}
             for a, targets in with_lazy_edges(graph()).items()}
    found = cycles(edges)
    assert not found, "import cycles: " + " | ".join(_describe(c, edges) for c in found)


def test_the_known_cycle_edges_still_exist():
    """An entry whose edge is gone must leave the list (so the list only ever shrinks to empty)."""
    stale = [f"{a} -> {b}" for a, b in KNOWN_CYCLE_EDGES if b not in graph().get(a, {})]
    assert not stale, f"remove from KNOWN_CYCLE_EDGES (the import is gone): {', '.join(stale)}"


@pytest.mark.parametrize(
    "module",
    [
        "auditor.audit.runner",
        "auditor.audit.report",
        "auditor.audit.report.tables",
        "auditor.audit.report.plots",
        "auditor.audit.report.writer",
        "auditor.audit.sources",
        "auditor.audit.shard",
        "auditor.audit.commands",
        "auditor.audit.config",
        "auditor.audit.assumptions",
        "auditor.audit.plan",
        "auditor.audit.report.catalogue",
        "auditor.audit.verdicts",
    ],
)
def test_the_audit_is_in_no_cycle_at_all(module):
    """The audit's own modules are in no cycle, not even through a known edge elsewhere."""
    for component in cycles(graph()):
        assert module not in component, _describe(component, graph())


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


REPORT = "auditor.audit.report"
BELOW_THE_REPORT = (REPORT, "auditor.core")  # what the report may import from auditor


def test_the_report_sits_below_the_runner():
    """The report imports from ``auditor`` only itself and the shared core: not the runner, the plan, the
    configuration, the tests or the sources, which all build on it (the runner writes reports with it)."""
    offenders = [f"{a} -> {b} ({modules()[a].relative_to(REPO)}:{line})"
                 for a, targets in graph().items() if _inside(a, REPORT)
                 for b, line in targets.items()
                 if _inside(b, "auditor") and not any(_inside(b, below) for below in BELOW_THE_REPORT)]
    assert not offenders, "the report imports from above it: " + "; ".join(offenders)
    runner = graph()["auditor.audit.runner"]
    assert any(_inside(b, REPORT) for b in runner), (
        "the runner should write its report through auditor.audit.report"
    )


@pytest.mark.parametrize("module", ["auditor.audit.sources", "auditor.audit.extract", "auditor.audit.stream",
                                    "auditor.audit.shard"])
def test_the_token_sources_take_the_plan_not_the_configuration(module):
    """Sources and extraction receive the plan's parts (auditor.audit.plan), never the whole configuration,
    and never reach up into the runner."""
    reached = sorted(set(graph()[module]) & {"auditor.audit.config", "auditor.audit.runner"})
    assert not reached, f"{module} imports {', '.join(reached)}"


def test_only_the_lab_and_the_dispatcher_import_the_lab():
    allowed = {"auditor.cli"}
    offenders = [f"{a} -> {b} ({modules()[a].relative_to(REPO)}:{line})"
                 for a, targets in with_lazy_edges(graph()).items() for b, line in targets.items()
                 if (b == "auditor.lab" or b.startswith("auditor.lab."))
                 and not (a == "auditor.lab" or a.startswith("auditor.lab.") or a in allowed)]
    assert not offenders, "imports of auditor.lab from outside it: " + "; ".join(offenders)


def test_probes_imports_nothing_from_auditor():
    offenders = []
    for module, path in modules().items():
        if module.split(".")[0] != "probes":
            continue
        offenders += [f"{module} -> {name} (line {line})" for name, line in _imported_names(module, path)
                      if name == "auditor" or name.startswith("auditor.")]
    assert not offenders, "probes must stand alone: " + "; ".join(offenders)


def test_the_lazy_reader_sees_every_registry():
    """The scan finds the dispatcher's subcommands, the lab's tools and every room's references."""
    from auditor import cli
    from auditor.lab import TOOLS
    from auditor.lab import room as registry

    expected = {*cli.SUBCOMMANDS.values(), *(target for target, _ in TOOLS.values())}
    for room in registry.rooms().values():
        expected |= {*room.experiments.values(), *room.tools.values(), *([room.bits] if room.bits else [])}
    seen = {f"{target}:{attr}" for _, target, attr, _ in lazy_references()}
    assert expected <= seen, sorted(expected - seen)
    assert len(expected) > 20


def test_every_lazy_reference_resolves():
    broken = [f"{module}:{line} -> {target}:{attr}" for module, target, attr, line in lazy_references()
              if target not in modules() or attr not in _top_level_names(modules()[target])]
    assert not broken, "lazy references to nothing: " + "; ".join(broken)


def test_a_room_refers_only_to_its_own_modules():
    def is_room(module: str) -> bool:
        return (
            module.count(".") == 2
            and module.startswith("auditor.lab.")
            and modules()[module].name == "__init__.py"
        )

    offenders = [f"{module}:{line} -> {target}:{attr}" for module, target, attr, line in lazy_references()
                 if is_room(module) and not target.startswith(module + ".")]
    assert not offenders, "a room reaching into another package: " + "; ".join(offenders)


def _lab_room(module: str) -> str | None:
    """The room of a lab module (``facts`` for ``auditor.lab.facts.tau``); None outside the rooms: the lab's
    shared modules (``auditor/lab/*.py``), its shared layer (``auditor/lab/common``) and everything else."""
    from auditor.lab.room import SHARED

    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["auditor", "lab"] or parts[2] == SHARED:
        return None
    return parts[2] if (REPO / "auditor" / "lab" / parts[2] / "__init__.py").is_file() else None


def _cross_room(edges: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """(importer, imported, line) of every edge into a room from outside it."""
    return [(a, b, line) for a, targets in edges.items() for b, line in targets.items()
            if _lab_room(b) is not None and _lab_room(b) != _lab_room(a)]


def test_the_rooms_stand_alone():
    """A room imports the lab's shared modules and its own, never a sibling room; what two rooms share
    lives below them in ``auditor/lab/common``, which (like ``auditor/lab/*.py``) imports no room. Lazy
    references count: a room's ``"module:attribute"`` strings name its own modules only."""
    lab = {a: targets for a, targets in with_lazy_edges(graph()).items() if _inside(a, "auditor.lab")}
    offenders = [f"{a} -> {b} ({modules()[a].relative_to(REPO)}:{line})" for a, b, line in _cross_room(lab)]
    assert not offenders, "lab modules reaching into another room: " + "; ".join(offenders)


def test_the_room_reader_sees_a_sibling_import():
    """The rule above can fail: an import from one room into another, or from the shared layer into a
    room, is found; imports of the shared layer and of the room's own modules are not."""
    edges = {"auditor.lab.recall.scaling": {"auditor.lab.assoc.memories": 3, "auditor.lab.engine": 6,
                                            "auditor.lab.common.search.capacity": 4,
                                            "auditor.lab.recall.training": 5},
             "auditor.lab.common.mha.train": {"auditor.lab.memorize.experiment": 7}}
    assert _cross_room(edges) == [("auditor.lab.recall.scaling", "auditor.lab.assoc.memories", 3),
                                  ("auditor.lab.common.mha.train", "auditor.lab.memorize.experiment", 7)]


# The floors of docs/layout.md, lowest first: a module may import its own floor and those below it.
FLOORS = ("auditor.core", "auditor.data", "auditor.models", "auditor.audit")


def _floor(module: str) -> int | None:
    return next((i for i, floor in enumerate(FLOORS) if _inside(module, floor)), None)


def test_the_floors_only_point_down():
    """core <- data <- models <- audit: no import (lazy references included) reaches a higher floor, so the
    data reads its inputs without importing a model and the models never reach into the audit."""
    offenders = [f"{a} -> {b} ({modules()[a].relative_to(REPO)}:{line})"
                 for a, targets in with_lazy_edges(graph()).items() if _floor(a) is not None
                 for b, line in targets.items() if _floor(b) is not None and _floor(b) > _floor(a)]
    assert not offenders, "imports from a higher floor: " + "; ".join(offenders)
    assert not [b for b in graph()["auditor.data"] if _inside(b, "auditor.models")]


def test_the_floor_check_sees_a_data_module_importing_a_model(tmp_path):
    """The reader resolves the import that the floor rule refuses (so the rule above can fail)."""
    source = tmp_path / "mod.py"
    source.write_text("from auditor.models.base import LoadedModel\n")
    (name, _), = _imported_names("auditor.data.mod", source)
    target = _owner(name)
    assert target == "auditor.models.base" and _floor(target) > _floor("auditor.data.mod")


PUBLIC_ONLY = ("auditor.core", "auditor.data", "auditor.models")


def _private_imports(module: str, path: Path) -> list[str]:
    """``from x import _name`` in ``module`` where x is another module of the packages."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            source = _owner(node.module)
            if source is None or source == module:
                continue
            found += [f"{module}:{node.lineno} imports {alias.name} from {node.module}"
                      for alias in node.names if alias.name.startswith("_") and alias.name != "__version__"]
    return found


def test_core_data_and_models_import_only_public_names():
    """A private name (``_ADAPTERS``) is the module's own business: a neighbour asks through a public
    function (``auditor.models.registry.adapters``)."""
    offenders = [hit for module, path in modules().items() if any(_inside(module, p) for p in PUBLIC_ONLY)
                 for hit in _private_imports(module, path)]
    assert not offenders, "; ".join(offenders)


def test_the_private_import_reader_sees_one(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from auditor.models.registry import _ADAPTERS, resolve\n")
    assert _private_imports("auditor.models.mine", source) == [
        "auditor.models.mine:1 imports _ADAPTERS from auditor.models.registry"]


def _private_probes(module: str, path: Path) -> list[str]:
    """What ``module`` takes of probes' private names: ``from probes.x import _y``, ``import probes._x``,
    ``from probes._x import y`` and attributes read through the package (``probes.x._y``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and (
                node.module.split(".")[0] == "probes"):
            found += [f"{module}:{node.lineno} imports {node.module}" for part in node.module.split(".")
                      if part.startswith("_")][:1]
            found += [f"{module}:{node.lineno} imports {alias.name} from {node.module}"
                      for alias in node.names if alias.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [f"{module}:{node.lineno} imports {alias.name}" for alias in node.names
                      if alias.name.split(".")[0] == "probes"
                      and any(part.startswith("_") for part in alias.name.split("."))]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id == "probes":
                found.append(f"{module}:{node.lineno} reads {ast.unparse(node)}")
    return found


def test_the_audit_uses_only_the_public_api_of_probes():
    """probes offers the auditor what it needs as public names (streamed reductions, result assembly,
    validation, bounds): a private name of probes is its own business, free to change."""
    offenders = [hit for module, path in modules().items() if _inside(module, "auditor")
                 for hit in _private_probes(module, path)]
    assert not offenders, "; ".join(offenders)


def test_the_private_probes_reader_sees_each_form(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("import probes\nimport probes._omp\nfrom probes.assumptions import _check_n, check_n\n"
                      "from probes._omp import x\nprobes.rank._scale(1)\nprobes.check_rtol(None)\n")
    assert _private_probes("auditor.audit.mine", source) == [
        "auditor.audit.mine:2 imports probes._omp",
        "auditor.audit.mine:3 imports _check_n from probes.assumptions",
        "auditor.audit.mine:4 imports probes._omp",
        "auditor.audit.mine:5 reads probes.rank._scale",
    ]


LAYOUT = REPO / "docs" / "layout.md"
FOLDER = re.compile(r"(\w+)/")


def layout_sections() -> dict[str, str]:
    """folder (``auditor/models``) -> the text that the tree block of docs/layout.md writes beside it.

    The block is a tree indented by two spaces a level: a line whose first word is ``name/`` opens that
    folder (several on one line, ``memorize/ certify/``, open each with the same text); any other line
    continues the folder above it, and ``name.py`` at the start of a line names a file of the folder one
    level up."""
    text = LAYOUT.read_text()
    block = text.split("```", 2)[1]
    sections: dict[str, str] = {}
    stack: list[str] = []
    current: list[str] = []
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        words = line.split()
        opened = []
        for word in words:
            match = FOLDER.fullmatch(word)
            if not match:
                break
            opened.append(match.group(1))
        if opened:
            stack = stack[:depth]
            current = ["/".join([*stack, name]) for name in opened]
            stack.append(opened[0])
        elif words[0].endswith(".py") and depth <= len(stack):
            current = ["/".join(stack[:depth])]
        for folder in current:
            sections[folder] = sections.get(folder, "") + " " + line
    return sections


def test_the_layout_names_every_module():
    """Every module of ``probes`` and ``auditor`` is named (``name`` or ``name.py``) beside its folder in
    docs/layout.md, and every folder (package) has its line: a newcomer finds each file there."""
    sections = layout_sections()
    missing = []
    for path in sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py")):
        relative = path.relative_to(REPO)
        folder = relative.parent.as_posix()
        if folder not in sections:
            missing.append(f"{folder}/ (the folder)")
        elif path.name != "__init__.py" and not re.search(rf"(?<![\w.]){re.escape(path.stem)}(\.py)?\b",
                                                           sections[folder]):
            missing.append(relative.as_posix())
    assert not missing, "docs/layout.md does not name: " + ", ".join(dict.fromkeys(missing))


def test_the_layout_reader_finds_files_under_their_folder():
    sections = layout_sections()
    assert "limits" in sections["auditor/models"] and "plan.py" in sections["auditor/audit"]
    assert "kernels" in sections["probes/fast"] and "cli.py" in sections["auditor"]
    assert "catalogue" in sections["auditor/audit/report"] and "catalogue" not in sections["auditor/models"]
