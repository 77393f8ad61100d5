"""Process hygiene and leaving: no daemon process outlives its owner, even after SIGKILL, and a relay
that leaves gracefully (SIGTERM) lets the swarm train on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.lifecycle.shutdown_watch import BACKSTOP_S
from gwtfp2p.localswarm.processes import FAST
from tests.deadlines import scaled
from tests.integration.swarm import REPO_ROOT, Daemon, Swarm

pytestmark = pytest.mark.timeout(180)
GONE_WITHIN_S = 15.0
GRACE_S = float(FAST[FAST.index("--grace-s") + 1])
LEAVE_BOUND_S = GRACE_S + Timings().shutdown_s + BACKSTOP_S + 10.0  # 10 s: the process's own exit


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def wait_gone(processes: list[psutil.Process], timeout_s: float = GONE_WITHIN_S) -> list[str]:
    """Names of the processes still alive after ``timeout_s`` (zombies count as gone)."""
    deadline = time.monotonic() + timeout_s
    alive = processes
    while time.monotonic() < deadline:
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.1)
    return [f"{p.pid}:{p.name()}" for p in alive if p.is_running()]


def test_sigkilled_daemon_takes_its_dht_and_p2pd_along(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0")
        children = descendants(dh.popen.pid)
        assert any("p2pd" in p.name() for p in children), [p.name() for p in children]
        os.kill(dh.popen.pid, signal.SIGKILL)  # the daemon only, not its group
        dh.popen.wait(timeout=10)
        assert wait_gone(children) == []
    finally:
        swarm.close()


def busiest(relays: list[Daemon]) -> Daemon:
    """The relay that forwarded most by its next progress report (once a heartbeat: the latest one may
    predate every forward of a swarm that has just begun)."""
    cursors = [len(r.events) for r in relays]
    reports = [r.next_event(("progress",), cursor, 30)[0] for r, cursor in zip(relays, cursors, strict=True)]
    forwards = [report.get("forwards", 0) for report in reports]
    return relays[forwards.index(max(forwards))]


def test_graceful_leave_and_training_goes_on(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--min-nodes", "4")
        relays = [swarm.spawn_relay(name, stage) for name, stage in (("r1a", "1"), ("r1b", "1"), ("r2", "2"))]
        for relay in relays:
            relay.wait_ready()
        dh.wait_event("iteration", 90)
        busy = busiest(relays[:2])
        t = dh.of("iteration")[-1]["iteration"]
        busy.terminate()
        try:  # the product's bound on a leave (--grace-s + Timings.shutdown_s); past it, it says what hangs
            exit_code = busy.popen.wait(timeout=scaled(LEAVE_BOUND_S))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{busy.name} still running {LEAVE_BOUND_S:.0f} s after SIGTERM: {busy.stderr_tail(80)}")
        busy.wait_event("stopped", 10)
        assert exit_code == 0, busy.stderr_tail(80)
        after = dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= t + 5, 90,
                            "training after the relay left")
        assert after["loss"] is not None
    finally:
        swarm.close()


OWNER = """
import sys, tempfile
from pathlib import Path
from gwtfp2p.localswarm.processes import Swarm
swarm = Swarm(Path(tempfile.mkdtemp()))
swarm.start("dh0", "--role", "data")
print("up", flush=True)
sys.stdin.read()
"""


def test_local_swarm_owner_sigkilled_reaps_its_daemons() -> None:
    """What ``gwtf demo`` (and tests) start dies with its owner, even a SIGKILLed one."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "up"
        children = descendants(owner.pid)
        assert any("p2pd" in p.name() for p in children), [p.name() for p in children]
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        assert wait_gone(children) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
