"""What an audit returns: :class:`AuditResult` (rows, Kruskal curves, per-context ranks, time per stage)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import torch

from auditor.audit.report.tables import STAGE_COLUMNS, summary_table

if TYPE_CHECKING:
    from auditor.audit.config import AuditConfig


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
        depth: the depth profile, one row per weights x depth (columns: :mod:`auditor.audit.report.depth`); empty
            unless the audit ran across depth (``layers``, or two or more ``block.L`` representations).
        out: the report folder, if one was written.
    """

    rows: pd.DataFrame
    curves: pd.DataFrame
    config: AuditConfig
    context_ranks: dict[str, torch.Tensor] = field(default_factory=dict)  # "repr@weights" -> (N,) ranks
    margins: dict[str, torch.Tensor] = field(default_factory=dict)
    stages: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(STAGE_COLUMNS)))
    depth: pd.DataFrame = field(default_factory=pd.DataFrame)
    out: Path | None = None

    def __repr__(self) -> str:
        status = self.rows["status"] if "status" in self.rows else pd.Series(dtype=str)
        where = f"; report in {self.out}" if self.out is not None else ""
        head = (f"AuditResult({self.config.model}: {len(self.rows)} rows, {int((status == 'ok').sum())} tested, "
                f"{int((status == 'skipped').sum())} skipped{where})")
        table = summary_table(self.rows)
        return head if table.empty else f"{head}\n{table.to_string()}"
