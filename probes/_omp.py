"""OpenMP wait policy: set before torch loads its OpenMP runtime, so a shared machine has no cliff.

torch's CPU kernels run on an OpenMP team whose idle workers, by default, spin for a while before they
sleep. Beside another process that does the same (a second audit, a training run), the two teams'
spinning workers hold the cores that the other team's working threads need, and both crawl: on a
2-core machine a Kruskal test ran 13.8x slower on two threads than on one beside one other torch job
(``benchmarks/bench_contention.py``; figures in ``reports/benchmarks.md``). With the passive policy
idle workers sleep at once, which costs nothing measurable on a quiet machine.

The OpenMP runtime reads the policy once, when it is loaded, which is when torch is first imported.
Importing :mod:`probes` or :mod:`auditor` first sets it (``setdefault``: a value the user chose is kept);
a program that imports torch before them, or launches its own torch work, sets ``OMP_WAIT_POLICY=PASSIVE``
in the environment instead. :func:`wait_policy` says what this process got.
"""

from __future__ import annotations

import os
import sys

_TORCH_FIRST = "torch" in sys.modules  # torch (and its OpenMP runtime) loaded before this module
_USER_SET = "OMP_WAIT_POLICY" in os.environ  # a policy from the user's environment, kept as it is
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # GNU OpenMP (torch's PyPI builds), Intel OpenMP
os.environ.setdefault("KMP_BLOCKTIME", "0")  # Intel OpenMP's spin time, where a build uses it


def wait_policy() -> str:
    """``"passive"`` when the OpenMP runtime started with the passive policy, ``"default"`` when torch
    was imported before :mod:`probes` without one in the environment (idle workers spin), else the
    value the user set."""
    value = os.environ.get("OMP_WAIT_POLICY", "").strip().lower()
    if _TORCH_FIRST and not _USER_SET:
        return "default"
    return value or "default"

