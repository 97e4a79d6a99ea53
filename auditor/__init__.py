"""attention-auditor: test the token assumptions of attention-memorization theory on real models.

>>> import auditor
>>> rows = auditor.audit("vit-base", data="../shared/data/imagenet-sample", samples=300, subsets=1000)

``audit`` returns one row per representation x test as a pandas DataFrame (see :mod:`auditor.runner`);
the ``audit`` command line does the same and writes a report. The capacity lab lives in
:mod:`auditor.lab`.
"""

from auditor.runner import AuditConfig, audit

__all__ = ["AuditConfig", "audit"]
