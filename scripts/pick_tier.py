"""Choose the developer's test tier (``pytest -m fast``) from the measured durations of a full run.

Usage: ``pytest --junitxml=run.xml`` (the whole default suite), then
``python scripts/pick_tier.py run.xml [--budget 25] [--minimum 200]``, which rewrites ``tests/tier.txt``.

The tier is chosen by duration, not by module: first the fastest test of every test folder (one smoke test
per package and lab room), then the fastest remaining tests, taken module by module so that few modules need
collecting, until the summed duration reaches ``--budget`` seconds and at least ``--minimum`` tests are in.
Collection imports each chosen module, so modules are added in order of the time their tests save; a module
whose tests all run slower than ``--slowest`` seconds is never taken.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIER = ROOT / "tests" / "tier.txt"


def read_durations(junit: Path) -> dict[str, float]:
    """{node id: seconds} of the passed tests of a pytest junit XML report (skipped and failed left out)."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if any(child.tag in ("skipped", "failure", "error") for child in case):
            continue
        parts = [p for p in case.get("classname", "").split(".") if p]  # "tests.audit.test_api[.Class]"
        cut = next((i for i in range(len(parts), 0, -1)
                    if (ROOT / Path(*parts[:i]).with_suffix(".py")).is_file()), len(parts))
        path, classes = "/".join(parts[:cut]) + ".py", parts[cut:]
        node = "::".join([path, *classes, case.get("name", "")])
        out[node] = float(case.get("time", 0.0))
    return out


def folder(node: str) -> str:
    """The test folder of a node id (``tests/lab/facts``, ``tests/audit``, ``tests`` for top-level files)."""
    return str(Path(node.split("::")[0]).parent)


def pick(durations: dict[str, float], budget: float, minimum: int, slowest: float) -> list[str]:
    """The tier's node ids (see the module docstring)."""
    chosen: dict[str, float] = {}
    by_folder: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for node, seconds in durations.items():
        by_folder[folder(node)].append((seconds, node))
    for tests in by_folder.values():
        seconds, node = min(tests)
        chosen[node] = seconds
    by_module: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for node, seconds in durations.items():
        if node not in chosen and seconds <= slowest:
            by_module[node.split("::")[0]].append((seconds, node))
    taken_modules = {node.split("::")[0] for node in chosen}
    # modules already collected first, then the others by their median test time
    order = sorted(by_module, key=lambda m: (m not in taken_modules,
                                             sorted(s for s, _ in by_module[m])[len(by_module[m]) // 2]))
    total = sum(chosen.values())
    for module in order:
        for seconds, node in sorted(by_module[module]):
            if total + seconds > budget and len(chosen) >= minimum:
                break
            chosen[node] = seconds
            total += seconds
    return sorted(chosen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="junit XML of a full default run (pytest --junitxml=...)")
    parser.add_argument("--budget", type=float, default=25.0, help="summed test seconds (default 25)")
    parser.add_argument("--minimum", type=int, default=200, help="at least this many tests (default 200)")
    parser.add_argument("--slowest", type=float, default=1.5, help="leave out tests slower than this (s)")
    args = parser.parse_args(argv)
    durations = read_durations(args.junit)
    if not durations:
        parser.error(f"{args.junit} holds no passed test cases; give the junit XML of a full pytest run")
    tier = pick(durations, args.budget, args.minimum, args.slowest)
    TIER.write_text("# The developer's tier (pytest -m fast), chosen by scripts/pick_tier.py from measured "
                    "durations.\n" + "\n".join(tier) + "\n")
    total = sum(durations[n] for n in tier)
    modules = len({n.split("::")[0] for n in tier})
    sys.stdout.write(f"{len(tier)} tests from {modules} modules, {total:.1f} s of test time -> {TIER}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
