"""The capacity lab: how much an attention layer really memorizes.

Rooms: ``memorize`` (multi-head attention memorization, rank certificates, Paper A), ``facts``
(fact databases as tensors, Paper B) and ``assoc`` (associative memories and factual recall,
Paper C). They share one batched training engine (:mod:`auditor.lab.engine`) and one resumable sweep
runner (:mod:`auditor.lab.sweep`).
"""
