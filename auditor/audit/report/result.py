"""What an audit returns: :class:`AuditResult` (rows, Kruskal curves, per-context ranks, time per stage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd
import torch

from auditor.audit.report.tables import STAGE_COLUMNS, summary_table


class Configuration(Protocol):
    """What a report reads of the configuration that made its rows (the audit's
    :class:`~auditor.audit.config.AuditConfig`, a frozen dataclass whose fields also fill ``config.json``)."""

    @property
    def model(self) -> str: ...
    @property
    def subsets(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def threshold(self) -> float: ...
    @property
    def rtol(self) -> float | None: ...


@dataclass
class AuditResult:
    """Rows of an audit, the Kruskal curves of ``--sweep``, and what was skipped.

    Attributes:
        rows: one typed row per representation x test (columns: :mod:`auditor.audit.report.schema`).
        curves: the sweep's rows, one per representation x k (empty without ``sweep``).
        config: the configuration that made them.
        context_ranks, margins: ``"representation@weights"`` -> (N,) rank and margin of every context.
        stages: ``stage | seconds | share`` of the run's wall time up to the report (see
            :func:`auditor.audit.report.tables.stage_table`).
        depth: the depth profile, one row per weights x depth (columns: :mod:`auditor.audit.report.depth`);
            empty unless the audit ran across depth (``layers``, or two or more ``block.L`` representations).
        out: the report folder, if one was written.
        incomplete: the error that stopped the run after these rows (None: the run finished).
    """

    rows: pd.DataFrame
    curves: pd.DataFrame
    config: Configuration
    context_ranks: dict[str, torch.Tensor] = field(default_factory=dict)  # "repr@weights" -> (N,) ranks
    margins: dict[str, torch.Tensor] = field(default_factory=dict)
    stages: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(STAGE_COLUMNS)))
    depth: pd.DataFrame = field(default_factory=pd.DataFrame)
    out: Path | None = None
    incomplete: str | None = None

    def __repr__(self) -> str:
        status = self.rows["status"] if "status" in self.rows else pd.Series(dtype=str)
        where = f"; report in {self.out}" if self.out is not None else ""
        where += f"; INCOMPLETE, stopped by: {self.incomplete}" if self.incomplete else ""
        head = (
            f"AuditResult({self.config.model}: {len(self.rows)} rows, {int((status == 'ok').sum())} tested, "
            f"{int((status == 'skipped').sum())} skipped{where})"
        )
        table = summary_table(self.rows)
        return head if table.empty else f"{head}\n{table.to_string()}"
