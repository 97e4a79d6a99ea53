"""Reports of an audit: ``results.csv``, ``sweep.csv``, ``summary.md`` (the Table-1 layout) and plots."""

from auditor.report.tables import summary_table, write_report

__all__ = ["summary_table", "write_report"]
