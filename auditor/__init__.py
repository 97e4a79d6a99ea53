"""attention-auditor: test the token assumptions of attention-memorization theory on real models.

>>> import auditor
>>> rows = auditor.audit_model("vit-base", data="../shared/data/imagenet-sample", samples=300, subsets=1000)
>>> rows = auditor.audit_model(my_vit, my_image_processor,  # a model you hold
...                            "../shared/data/imagenet-sample")
>>> rows = auditor.audit_model(bridge, out="reports/mine")  # TransformerLens or nnsight (extra interp)
>>> rows = auditor.audit_tokens(contexts, queries)  # tensors you hold: (N, n, d) and (N, d)

Each returns one typed row per representation x test as a pandas DataFrame (integers as ``Int64``,
verdicts as ``boolean``, ``rank_counts`` a dict, ``witness`` a list; see :mod:`auditor.audit.report.schema`);
the ``audit`` command line does the same and writes a report. The capacity lab lives in
:mod:`auditor.lab`.
"""

import os
import sys
from typing import Any

if "torch" not in sys.modules:  # the OpenMP wait policy of probes._omp, set before torch loads; without
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # importing probes, so the command line starts
    os.environ.setdefault("KMP_BLOCKTIME", "0")  # without torch (`audit --help`)

__all__ = ["AuditConfig", "AuditResult", "audit_model", "audit_tokens", "run"]


def __getattr__(name: str) -> Any:
    """The audit's entry points, imported when first used (``import auditor`` itself loads no torch)."""
    if name in __all__:
        from auditor.audit import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'auditor' has no attribute {name!r}")
