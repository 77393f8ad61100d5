"""Test-session wiring shared by every suite: xdist grouping, the Hypothesis profile, the retry policy.

* pytest-xdist (``make test`` runs it): tests of one module stay on one worker (module fixtures: a
  wheel build, a shared bootstrap peer), and the hostile-peer suite stays on one worker as a whole
  (its tests share one honest swarm, a session fixture): each test gets the xdist group of its
  module, or ``adversarial``; run with ``--dist loadgroup``.
* One Hypothesis profile, ``gwtf``, loaded whether or not ``CI`` is set, so a property test draws
  the same examples in a developer's shell as in CI (derandomized, no example database, no
  deadline) and prints the blob that reproduces a failure. Hypothesis would otherwise load its
  own ``ci`` profile under ``CI=true`` and a random one elsewhere.
* Tests of real processes (``tests/integration``, ``tests/adversarial``, ``tests/packaging``) may
  be retried at most twice (pytest-rerunfailures); every retry is named in the run's closing
  summary (``-rR``) with the first lines of the error that caused it (a section ``why each retry``)
  and the last lines the failed try printed (pytest shows them nowhere else); each known cause is
  recorded in docs/testing.md. Unit and simulator tests are never retried.
* ``$GWTF_TEST_DEADLINE_FACTOR`` (tests/deadlines.py) multiplies every test's pytest-timeout limit
  (its own marker, or the ``timeout`` of pyproject.toml), as it does every wait on a daemon's events.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.deadlines import DEADLINE_FACTOR, scaled_timeout

TESTS = Path(__file__).resolve().parent
REAL_PROCESS_SUITES = ("integration", "adversarial", "packaging")
REAL_PROCESS_RERUNS = 2
RETRY_REASON_CHARS = 300
RETRY_REASON_LINES = 4
RETRY_OUTPUT_LINES = 60  # of a retried try's captured output, the last lines printed under its RETRIED line
RETRY_OUTPUT_CHARS = 400
# (test, phase, first error lines, end of its captured output) of each failed try that was retried
_RETRIED: list[tuple[str, str, str, list[str]]] = []

settings.register_profile(
    "gwtf",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("gwtf")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    retries = config.pluginmanager.hasplugin("rerunfailures")  # off in a flake hunt: first tries only
    for item in items:
        timeout = (scaled_timeout(item.get_closest_marker("timeout"), config.getini("timeout"))
                   if DEADLINE_FACTOR != 1.0 else None)
        if timeout is not None:
            item.add_marker(timeout, append=False)  # prepended: the closest marker is the one that counts
        path = Path(str(item.path)).resolve().relative_to(TESTS)
        group = "adversarial" if path.parts[0] == "adversarial" else path.as_posix()
        item.add_marker(pytest.mark.xdist_group(group))
        if retries and path.parts[0] in REAL_PROCESS_SUITES and item.get_closest_marker("flaky") is None:
            item.add_marker(pytest.mark.flaky(reruns=REAL_PROCESS_RERUNS))


def _first_error_line(report: pytest.TestReport) -> str:
    """What a failed try's report says failed: its first ``E `` lines (the exception, and for a failed
    ``assert`` the comparison pytest explains), each cut short; else the report's last line."""
    text = str(report.longrepr or "")
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ") and line[1:].strip()]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not errors:
        return (lines[-1] if lines else "(no report)")[:RETRY_REASON_CHARS]
    return " | ".join(e[:RETRY_REASON_CHARS] for e in errors[:RETRY_REASON_LINES])


def _output_tail(report: pytest.TestReport) -> list[str]:
    """The last lines a failed try printed (pytest shows a retried try's output nowhere else), each cut
    short, under the name of the section they came from."""
    lines: list[str] = []
    for title, text in report.sections:
        if title.startswith("Captured") and text.strip():
            lines += [f"[{title}]"] + [line[:RETRY_OUTPUT_CHARS] for line in text.rstrip().splitlines()]
    return lines[-RETRY_OUTPUT_LINES:]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":
        _RETRIED.append((report.nodeid, report.when, _first_error_line(report), _output_tail(report)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Every retried try and the first line of its error: a retry must say why, not only that it happened."""
    if _RETRIED:
        terminalreporter.section("why each retry")
        for nodeid, when, reason, output in _RETRIED:
            terminalreporter.write_line(f"RETRIED {nodeid} ({when}): {reason}")
            for line in output:
                terminalreporter.write_line(f"    {line}")
