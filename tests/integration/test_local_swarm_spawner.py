"""A daemon started from a thread that then exits (the chaos driver's) must live on: the parent-death
signal of a local swarm's children fires when the *forking thread* exits, so ``local_swarm`` forks
every child from one long-lived spawner thread. (Before, replacements started by the chaos thread
were SIGKILLed when it stopped.)"""

from __future__ import annotations

import subprocess
import threading

import pytest

from gwtfp2p.localswarm import processes as local_swarm

pytestmark = pytest.mark.timeout(30)


def test_child_outlives_the_thread_that_asked_for_it() -> None:
    started: list[subprocess.Popen] = []

    def ask() -> None:
        started.append(local_swarm._SPAWNER.submit(
            lambda: subprocess.Popen(["sleep", "30"], preexec_fn=local_swarm._die_with_parent)).result())

    thread = threading.Thread(target=ask)
    thread.start()
    thread.join()
    child = started[0]
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=1.5)  # still running well after its requesting thread is gone
    finally:
        child.kill()
        child.wait(timeout=10)
