"""The declared defaults of every experiment's units, against a committed snapshot.

A unit's resume key leaves out the entries at their declared default (``auditor.lab.sweep.key_fields``),
so a finished unit's key does not say what those entries were. Changing such a default would silently
hand the old units to the new default: this test stops that. Adding a field with a default is safe and
only needs the snapshot regenerated; changing a default needs the finished units migrated
(``scripts/migrate_units.py``), or the change made in a preset instead.

Regenerate the snapshot with ``python tests/lab/test_key_defaults.py``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from auditor.lab.room import experiments, get
from auditor.lab.sweep import field_defaults

SNAPSHOT = Path(__file__).resolve().parents[1] / "fixtures" / "key_defaults.json"


def _declared(value: Any) -> Any:
    if isinstance(value, type) and dataclasses.is_dataclass(value):
        return {f"<{value.__name__}>": field_defaults(value)}
    if isinstance(value, list):
        return [_declared(v) for v in value]
    if isinstance(value, dict):
        return {k: _declared(v) for k, v in value.items()}
    return value


def declared_defaults() -> dict[str, Any]:
    """Every registered experiment's declared unit defaults, as JSON."""
    return json.loads(json.dumps({name: _declared(get(name).key_defaults) for name in sorted(experiments())}))


def _changes(old: Any, new: Any, path: str) -> list[str]:
    """Defaults of ``old`` that ``new`` changes or drops (entries only ``new`` has are additions)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            c for k in old for c in (_changes(old[k], new[k], f"{path}.{k}") if k in new else [f"{path}.{k}"])
        ]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [c for i, (o, n) in enumerate(zip(old, new)) for c in _changes(o, n, f"{path}[{i}]")]
    return [] if old == new else [path]


def test_no_declared_default_of_a_unit_changed():
    recorded, now = json.loads(SNAPSHOT.read_text()), declared_defaults()
    changed = _changes(recorded, now, "")
    assert not changed, (
        f"declared unit defaults changed: {changed}; finished units keyed with the old defaults "
        "would resume as the new ones: migrate them (scripts/migrate_units.py) or change a preset "
        "instead, then regenerate the snapshot (python tests/lab/test_key_defaults.py)"
    )
    assert recorded == now, (
        "defaults were added: regenerate the snapshot (python tests/lab/test_key_defaults.py)"
    )


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(declared_defaults(), indent=1, sort_keys=True) + "\n")
