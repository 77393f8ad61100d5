"""``$GWTF_TEST_DEADLINE_FACTOR``: parsed once, with a clear error; it scales test limits and swarm waits."""

from __future__ import annotations

import pytest

from gwtfp2p.localswarm.processes import Swarm
from tests.deadlines import DEADLINE_FACTOR_ENV, deadline_factor, scaled_timeout


def test_the_factor_is_one_unless_set_and_must_be_a_positive_number() -> None:
    assert deadline_factor({}) == 1.0 and deadline_factor({DEADLINE_FACTOR_ENV: " "}) == 1.0
    assert deadline_factor({DEADLINE_FACTOR_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "fast", "inf", "nan"):
        with pytest.raises(ValueError, match=DEADLINE_FACTOR_ENV):
            deadline_factor({DEADLINE_FACTOR_ENV: bad})


def test_a_test_limit_is_scaled_from_its_marker_or_the_ini() -> None:
    own = pytest.mark.timeout(420, method="thread").mark
    scaled = scaled_timeout(own, "300", factor=2.0)
    assert scaled is not None and scaled.mark.args == (840.0,) and scaled.mark.kwargs == {"method": "thread"}
    by_keyword = scaled_timeout(pytest.mark.timeout(timeout=10).mark, "300", factor=3.0)
    assert by_keyword is not None and by_keyword.mark.args == (30.0,) and by_keyword.mark.kwargs == {}
    from_ini = scaled_timeout(None, "300", factor=1.5)
    assert from_ini is not None and from_ini.mark.args == (450.0,)
    assert scaled_timeout(None, "0", factor=2.0) is None and scaled_timeout(None, None, factor=2.0) is None


def test_a_swarm_refuses_a_factor_that_is_no_positive_number(tmp_path) -> None:
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="deadline_factor"):
            Swarm(tmp_path, deadline_factor=bad)
