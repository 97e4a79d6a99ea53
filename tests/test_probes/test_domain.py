"""The domain of the certificates: what each entry point proves at the edges of its input (a tolerance of
0, zero vectors and contexts, extreme dynamic range), and the one-line errors for what it refuses."""

from __future__ import annotations

import re

import pytest
import torch

import probes

ENTRY_POINTS = {
    "kruskal_test": lambda x, **kw: probes.kruskal_test(x, 2, **kw),
    "kruskal_sweep": lambda x, **kw: probes.kruskal_sweep(x, [1, 2], **kw),
    "kruskal_rank_exact": lambda x, **kw: probes.kruskal_rank_exact(x, **kw),
    "kruskal_lower_bound": lambda x, **kw: probes.kruskal_lower_bound(x, **kw),
    "assumption1": lambda x, **kw: probes.assumption1(x, 2, **kw),
    "general_position": lambda x, **kw: probes.general_position(x, **kw),
    "assumption2": lambda x, **kw: probes.assumption2(x.reshape(3, 2, 4), **kw),
    "assumption3": lambda x, **kw: probes.assumption3(x.reshape(3, 2, 4), x[:3], 2, **kw),
    "context_ranks": lambda x, **kw: probes.context_ranks(x.reshape(3, 2, 4), **kw),
    "numerical_rank": lambda x, **kw: probes.numerical_rank(x, **kw),
    "check_witness": lambda x, **kw: probes.check_witness(x, (0, 1), **kw),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_rtol_zero_is_refused_in_one_line(name):
    """At rtol = 0 every nonzero float64 singular value counts, rounding noise included: no verdict there
    can be proven, so every entry point refuses it with the same ValueError (not a ZeroDivisionError)."""
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.raises(ValueError, match=re.escape("rtol must be a finite number in (0, 1), got 0")) as info:
        ENTRY_POINTS[name](x, rtol=0)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=re.escape("(0, 1)")):
        ENTRY_POINTS[name](x, rtol=0.0)
