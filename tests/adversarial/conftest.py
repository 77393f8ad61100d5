"""One honest swarm for the hostile-peer suite (package scope: it stops after the suite's last test, so it
never loads the machine under the integration tests that follow), and Mallory, a hostile volunteer per test.

The swarm (real ``gwtf join`` processes on 127.0.0.1, ``support.Honest``): a data holder that
cross-checks a third of its microbatches, two replicas of each of two stages. Every test attacks it and
then checks what issue 14 asks of the swarm. Process hygiene (nothing outlives a test) is the
integration suite's fixtures, imported here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.adversarial.support import CROSS_CHECK, SPEC, Honest, Mallory
from tests.integration.churn_support import write_spec
from tests.integration.conftest import (  # noqa: F401 - fixtures: nothing outlives a test or the session
    no_process_outlives_its_test,
    reap_children_at_session_end,
)
from tests.integration.swarm import Swarm


@pytest.fixture(scope="package")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Honest]:
    logs = tmp_path_factory.mktemp("adversarial")
    swarm = Swarm(logs)
    try:
        dh = swarm.start_data_holder("dh", "--run-spec", write_spec(SPEC, logs / "spec.json"), "--min-nodes", "5",
                                     "--cross-check", CROSS_CHECK)
        stages = {k: [swarm.spawn_relay(f"r{k}{c}", str(k), "--capacity", "4") for c in "ab"] for k in (1, 2)}
        for relay in swarm.daemons[1:]:
            relay.wait_ready()
        result = Honest(swarm, dh, stages)
        result.train(3, timeout_s=180)
        yield result
    finally:
        swarm.close()


def _hostile(honest: Honest, name: str) -> Iterator[Mallory]:
    hostile = Mallory(honest.dh.maddr, honest.swarm.log_dir / f"{name}.stderr")
    try:
        yield hostile
    finally:
        hostile.kill()


@pytest.fixture
def mallory(honest: Honest, request: pytest.FixtureRequest) -> Iterator[Mallory]:
    """A hostile volunteer who becomes a member or publishes records of her own: killed after the test."""
    yield from _hostile(honest, f"mallory-{request.node.name}")


@pytest.fixture(scope="package")
def outsider(honest: Honest) -> Iterator[Mallory]:
    """A hostile volunteer who never joins the run: the same one for every test that needs no more."""
    yield from _hostile(honest, "outsider")
