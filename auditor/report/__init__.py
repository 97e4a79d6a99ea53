"""Reports of an audit: ``results.csv``, ``sweep.csv``, ``summary.md`` (the Table-1 layout) and plots.

``read_rows("…/results.csv")`` gives the typed rows back (see :mod:`auditor.report.schema`); the report
folder itself (lock, resume, tidying) is :mod:`auditor.report.folder`.
"""

from auditor.report.schema import read_rows
from auditor.report.tables import summary_table, write_report

__all__ = ["read_rows", "summary_table", "write_report"]
