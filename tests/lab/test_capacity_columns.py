"""The capacity room's assumption columns carry the probes' verdicts (a renamed result field must not
leave them empty)."""

from __future__ import annotations

import torch

from auditor.lab.capacity.experiment import assumption_columns


def test_assumption_columns_are_filled_from_the_probes():
    g = torch.Generator().manual_seed(3)
    contexts = torch.randn(12, 3, 8, generator=g, dtype=torch.float64)  # (N, n, d)
    queries = torch.randn(12, 8, generator=g, dtype=torch.float64)
    queries[5] = queries[1] + queries[2]  # a dependent triple: the share stays high, a witness exists
    out = assumption_columns(contexts, queries, n=3, subsets=500, seed=0, prefix="")
    assert out["assumption2_holds"] is True and out["assumption2_fraction"] == 1.0
    assert isinstance(out["assumption1_holds"], bool) and 0.0 < out["assumption1_fraction"] < 1.0
