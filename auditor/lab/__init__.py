"""The capacity lab: how much an attention layer really memorizes.

Rooms: ``memorize`` (multi-head attention memorization, rank certificates, Paper A), ``facts`` (fact
databases as tensors, Paper B) and ``assoc`` (associative memories and factual recall, Paper C). They
share one batched training engine (:mod:`auditor.lab.engine`), one resumable sweep runner that stamps
the provenance (:mod:`auditor.lab.sweep`, executing through :mod:`auditor.core.execution`), one experiment
contract and registry (:mod:`auditor.lab.experiment`) and one command-line layer built on it
(:mod:`auditor.lab.cli`).
"""
