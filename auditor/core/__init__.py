"""Shared machinery below every floor: errors, safe file writes, execution backends, options, provenance,
and whether the Hugging Face hub answers.

Nothing here imports the audit, the models, the data or the lab (``tests/test_layers.py`` checks it)."""
