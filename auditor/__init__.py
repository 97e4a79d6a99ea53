"""attention-auditor: test the token assumptions of attention-memorization theory on real models.

>>> import auditor
>>> rows = auditor.audit_model("vit-base", data="../shared/data/imagenet-sample", samples=300, subsets=1000)
>>> rows = auditor.audit_model(my_vit, my_image_processor,  # a model you hold
...                            "../shared/data/imagenet-sample")
>>> rows = auditor.audit_tokens(contexts, queries)  # tensors you hold: (N, n, d) and (N, d)

Each returns one typed row per representation x test as a pandas DataFrame (integers as ``Int64``,
verdicts as ``boolean``, ``rank_counts`` a dict, ``witness`` a list; see :mod:`auditor.audit.report.schema`);
the ``audit`` command line does the same and writes a report. The capacity lab lives in
:mod:`auditor.lab`.
"""

from probes import _omp  # noqa: F401, I001 -- first: sets the OpenMP wait policy before torch loads
from auditor.audit.runner import AuditConfig, AuditResult, audit_model, audit_tokens, run

__all__ = ["AuditConfig", "AuditResult", "audit_model", "audit_tokens", "run"]
