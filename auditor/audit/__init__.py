"""The audit: a validated plan -> token sources -> extraction -> the assumption tests -> rows -> a report.

The public entry points are re-exported by :mod:`auditor` (``auditor.audit_model``,
``auditor.audit_tokens``)."""
