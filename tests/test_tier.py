"""The developer's tier (``pytest -m fast``, ``tests/tier.txt``) names tests that exist."""

from __future__ import annotations

import pytest
from conftest import TIER_MISSING, _tier


def test_tier_names_collected_tests(request):
    """Every name in tests/tier.txt is a test of the default suite (renamed or removed tests are caught
    here; rerun ``scripts/pick_tier.py`` on a fresh junit XML to choose the tier again)."""
    missing = request.config.stash.get(TIER_MISSING, None)
    if missing is None:
        pytest.skip("only a run of the whole default suite collects every test to compare with")
    assert len(_tier()) >= 200
    assert not missing, f"tests/tier.txt names tests that no longer exist: {missing[:5]}"
