"""Process hygiene and helpers for integration tests (real hivemind peers on 127.0.0.1).

* Every peer subprocess starts in its own session (process group) and is killed as a group.
* After each test, processes it left behind (DHT children, p2pd) get a short grace period and are
  then killed, and the test fails: no process outlives its test.
* At the end of the session, every remaining descendant of the test process is reaped
  (except torch's shared-memory manager, which exits on its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import uvloop

from gwtfp2p.dht.hivemind_log import P2PD_LEVEL_ENV
from gwtfp2p.localswarm.processes import FORK_ENV
from tests.deadlines import scaled
from tests.integration.swarm import SESSION_ZYGOTES

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = scaled(60.0)
LEFTOVER_GRACE_S = 10.0
IGNORED_CHILDREN = ("torch_shm_manager",)  # torch's shared-memory helper lives for the whole session
T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
    """Run a coroutine on a fresh uvloop event loop (as the daemon does) with an overall deadline."""
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)

    return uvloop.run(bounded())


def _descendants() -> list[psutil.Process]:
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    alive = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE and child.name() not in IGNORED_CHILDREN:
                alive.append(child)
    return alive


def reap(processes: list[psutil.Process], grace_s: float = 3.0) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=grace_s)


@pytest.fixture(scope="session", autouse=True)
def reap_children_at_session_end() -> Iterator[None]:
    # torch_shm_manager is spared: it exits with its last client, and killing it first makes
    # torch abort ("Broken pipe") when the session later frees shared tensors.
    # The session's zygote (swarm.SESSION_ZYGOTES) starts here, before any test counts its processes.
    # Every daemon's log keeps its p2pd's own lines (a p2pd that stops completing handshakes: docs/testing.md).
    os.environ.setdefault(P2PD_LEVEL_ENV, "DEBUG")
    if os.environ.get(FORK_ENV, "1") != "0":
        SESSION_ZYGOTES.start()
    yield
    SESSION_ZYGOTES.close()
    reap(_descendants())


@pytest.fixture(autouse=True)
def no_process_outlives_its_test() -> Iterator[None]:
    before = {p.pid for p in _descendants()}
    yield
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    leftovers = [p for p in _descendants() if p.pid not in before]
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = [p for p in _descendants() if p.pid not in before]
    if leftovers:
        names = [f"{p.pid}:{p.name()}" for p in leftovers if p.is_running()]
        reap(leftovers)
        pytest.fail(f"processes outlived the test: {names}")


@dataclass
class PeerProcess:
    """A peer started by ``tests.integration.peer_main`` in its own process group."""

    popen: subprocess.Popen
    peer_id: str
    maddrs: list[str]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def freeze(self) -> None:
        """SIGSTOP the peer's Python process only: its p2pd still accepts connections."""
        os.kill(self.pid, signal.SIGSTOP)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def _read_ready_line(popen: subprocess.Popen, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    assert popen.stdout is not None
    while time.monotonic() < deadline:
        readable, _, _ = select.select([popen.stdout], [], [], 0.1)
        if readable:
            line = popen.stdout.readline()
            if line:
                return json.loads(line)
        if popen.poll() is not None:
            raise RuntimeError(f"peer process exited with code {popen.returncode} before it was ready")
    raise TimeoutError(f"peer process not ready within {timeout_s:.0f} s")


def start_peer(mode: str, *peers: str) -> PeerProcess:
    """Start ``tests.integration.peer_main MODE PEERS...`` in a new session; wait for its ready line."""
    popen = subprocess.Popen([sys.executable, "-m", "tests.integration.peer_main", mode, *peers],
                             cwd=REPO_ROOT, stdout=subprocess.PIPE, start_new_session=True)
    try:
        info = _read_ready_line(popen, READY_TIMEOUT_S)
    except BaseException:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=10)
        raise
    return PeerProcess(popen, info["peer_id"], info["maddrs"])


@pytest.fixture
def spawn_peer() -> Iterator[Callable[..., PeerProcess]]:
    """Start peers for one test; each one's process group is SIGKILLed at teardown."""
    started: list[PeerProcess] = []

    def spawn(mode: str, *peers: str) -> PeerProcess:
        started.append(start_peer(mode, *peers))
        return started[-1]

    yield spawn
    for peer in started:
        peer.kill_group()
