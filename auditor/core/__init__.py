"""Shared machinery below every room: errors, safe file writes, execution backends, options, provenance.

Nothing here imports the audit, the models, the data or the lab."""
