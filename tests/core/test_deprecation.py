"""A deprecation names the release that removes it, and refuses to outlive it."""

from __future__ import annotations

import pytest

from auditor.core.options import Deprecation

pytestmark = pytest.mark.fast  # the developer's tier: pytest -m fast


def test_the_notice_names_the_old_and_new_spelling_and_the_release_that_removes_the_old():
    shim = Deprecation("--tol", "--cp-tolerance", removed_in="0.3")
    assert (
        shim.notice(installed=(0, 2, 1))
        == "warning: --tol is deprecated and is removed in 0.3; use --cp-tolerance"
    )
    assert not shim.expired((0, 2, 9))


@pytest.mark.parametrize("installed", [(0, 3), (0, 3, 0), (1, 0)])
def test_a_shim_past_its_release_is_an_error_not_a_warning(installed):
    shim = Deprecation("--tol", "--cp-tolerance", removed_in="0.3")
    assert shim.expired(installed)
    with pytest.raises(RuntimeError, match="was to be removed in 0.3; delete its shim"):
        shim.notice(installed)


def test_the_release_is_a_version_number():
    with pytest.raises(ValueError, match="like 0.3 or 0.3.1"):
        Deprecation("--old", "--new", removed_in="next release")
