"""The snapshot of the registry that ``audit models`` lists (:data:`auditor.audit.model_list.MODELS`):
derived from the registry here, written into :mod:`auditor.audit.model_list` by
``python -m auditor.audit.model_snapshot``."""

from __future__ import annotations

from pathlib import Path

import click

from auditor.audit import model_list
from auditor.audit.model_list import ModelLine


def registry_lines() -> tuple[ModelLine, ...]:
    """The lines of every registered name, derived from the registry (imports the model families)."""
    from auditor.audit.config import AuditConfig
    from auditor.audit.plan import AuditPlan, architecture
    from auditor.models import known_models, resolve

    plan = AuditPlan.of(AuditConfig())
    lines = []
    for name in known_models():
        spec = resolve(name)
        shape = architecture(spec, "random", "random", plan.context_length(spec, "random"))
        n, d = (None, None) if shape is None else (shape[0], shape[1])
        lines.append(ModelLine(name, spec.family, spec.modality, n, d, spec.source, spec.description))
    return tuple(lines)


def snapshot_text(lines: tuple[ModelLine, ...]) -> str:
    """The Python text of :data:`auditor.audit.model_list.MODELS` holding ``lines``."""
    body = "".join(
        f"    ModelLine({line.name!r}, {line.family!r}, {line.modality!r}, {line.n!r}, {line.d!r}, "
        f"{line.source!r},\n              {line.description!r}),\n"
        for line in lines
    )
    return f"MODELS: tuple[ModelLine, ...] = (\n{body})\n"


def write_snapshot(path: Path = Path(model_list.__file__)) -> bool:
    """Write the registry's lines into the snapshot of ``path`` (model_list.py); True when it changed."""
    text = path.read_text()
    begin, end = "# BEGIN SNAPSHOT", "# END SNAPSHOT"
    head, rest = text.split(begin, 1)
    marker, tail = rest.split(end, 1)
    new = head + begin + marker.split("\n", 1)[0] + "\n" + snapshot_text(registry_lines()) + end + tail
    if new != text:
        path.write_text(new)
    return new != text


if __name__ == "__main__":
    changed = write_snapshot()
    click.echo("snapshot written" if changed else "snapshot already matches the registry", err=True)
