"""One factor for every deadline of the real-process tests, for machines slower than this one.

``$GWTF_TEST_DEADLINE_FACTOR`` (a positive number, default 1) multiplies every wait on a daemon's
events (``Swarm``'s ``deadline_factor``: ``wait_for``, ``wait_event``, ``wait_ready``,
``next_event``), every test's pytest-timeout limit (``tests/conftest.py``) and the fixed waits the
helpers pass through ``scaled``. The deadlines were chosen on the 2-core machine CI runs on
(docs/testing.md): a machine half as fast sets 2. Nothing here shortens a wait on an event: a
deadline only bounds how long a test may wait for something that should happen.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

import pytest

DEADLINE_FACTOR_ENV = "GWTF_TEST_DEADLINE_FACTOR"


def deadline_factor(environ: Mapping[str, str] = os.environ) -> float:
    """The factor ``environ`` asks for (1 when unset); ValueError naming the variable and the fix."""
    text = environ.get(DEADLINE_FACTOR_ENV, "").strip()
    if not text:
        return 1.0
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"${DEADLINE_FACTOR_ENV}={text!r}: must be a positive number (e.g. 2 on a machine "
                         f"half as fast as CI's); unset it for 1")
    return factor


DEADLINE_FACTOR = deadline_factor()


def scaled(seconds: float) -> float:
    """``seconds`` for this machine: the deadline chosen on CI's machine times ``DEADLINE_FACTOR``."""
    return seconds * DEADLINE_FACTOR


def scaled_timeout(marker: pytest.Mark | None, ini_timeout: str | float | None,
                   factor: float = DEADLINE_FACTOR) -> pytest.MarkDecorator | None:
    """The pytest-timeout marker for a test whose closest ``timeout`` marker is ``marker`` (else the ini's
    limit): its limit times ``factor``, its other options kept; None when the test has no limit."""
    kwargs = dict(marker.kwargs) if marker is not None else {}
    limit = marker.args[0] if marker is not None and marker.args else kwargs.pop("timeout", None)
    if limit is None:
        limit = ini_timeout
    if not limit or float(limit) <= 0:
        return None
    return pytest.mark.timeout(float(limit) * factor, **kwargs)
