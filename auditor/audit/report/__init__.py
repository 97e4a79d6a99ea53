"""Reports of an audit: ``results.csv``, ``sweep.csv``, ``summary.md`` (the Table-1 layout) and plots.

- :mod:`auditor.audit.report.schema`: the row columns, their types, their CSV text;
  ``read_rows("…/results.csv")``
  gives the typed rows back.
- :mod:`auditor.audit.report.result`: :class:`AuditResult`, what an audit returns.
- :mod:`auditor.audit.report.tables`: the tables (Table 1, Kruskal ranks, time per stage) as DataFrames.
- :mod:`auditor.audit.report.writer` and :mod:`auditor.audit.report.plots`: the files.
- :mod:`auditor.audit.report.folder`: the report folder itself (lock, resume, tidying).

The report reads rows; it never imports the runner that makes them.
"""

from auditor.audit.report.result import AuditResult
from auditor.audit.report.schema import read_rows
from auditor.audit.report.tables import stage_table, summary_table
from auditor.audit.report.writer import write_report

__all__ = ["AuditResult", "read_rows", "stage_table", "summary_table", "write_report"]
