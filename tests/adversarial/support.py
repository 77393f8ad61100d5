"""What the hostile-peer suite drives: the honest swarm's handle and checks, Mallory, hostile daemons.

The swarm (real ``gwtf join`` processes on 127.0.0.1): a data holder that cross-checks a third of its
microbatches, two replicas of each of two stages. Every test attacks it and then checks what the issue
asks of the swarm: it keeps training (the data holder's iterations go on, the loss does not climb),
honest replicas stay bit-identical, no honest loop dies, and the attack shows in a log or ``gwtf status``.
Process hygiene (nothing outlives a test) is the integration suite's.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gwtfp2p.config import RunSpec
from gwtfp2p.localswarm.processes import FORK_ENV
from gwtfp2p.localswarm.zygote import ForkedProcess
from tests.integration.conftest import run_async
from tests.integration.swarm import REPO_ROOT, SESSION_ZYGOTES, Daemon, Swarm

# Iterations of about a second here: a joiner verifies the state it downloads against the hashes the stage's
# records announce (published every heartbeat, 2 s); a stage stepping several times a second outruns them.
SPEC = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=14, lr=3e-3, microbatch_size=2,
               seq_len=32, microbatches_per_dh=8)
CROSS_CHECK = "0.3"
MALLORY_MODULE = "tests.adversarial.mallory"


@dataclass
class Honest:
    """The shared swarm: the data holder and the relays of each stage."""

    swarm: Swarm
    dh: Daemon
    stages: dict[int, list[Daemon]]

    @property
    def relays(self) -> list[Daemon]:
        return [d for stage in sorted(self.stages) for d in self.stages[stage]]

    def iteration(self) -> int:
        """The data holder's last finished iteration (-1 before the first)."""
        done = self.dh.of("iteration")
        return done[-1]["iteration"] if done else -1

    def train(self, iterations: int, timeout_s: float = 120.0) -> int:
        """Wait until the data holder finished ``iterations`` more iterations; returns the last one."""
        target = self.iteration() + iterations
        self.dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= target, timeout_s,
                         f"iteration {target} (training goes on)")
        return self.iteration()

    def losses(self, first: int, last: int) -> list[float]:
        return [e["loss"] for e in self.dh.of("iteration") if first <= e["iteration"] <= last and e["loss"]]

    def assert_healthy(self, since: int, more: int = 3) -> None:
        """Training goes on past ``since``, the loss does not climb, every honest relay steps, and the
        replicas of each stage have one state hash at every iteration from ``since`` on."""
        last = self.train(more)
        before, after = self.losses(since - 3, since), self.losses(last - 2, last)
        assert after and statistics.mean(after) < statistics.mean(before or after) + 0.25, (before, after)
        for stage, replicas in self.stages.items():
            steps = [{e["iteration"]: e["hash"] for e in r.of("step") if e["iteration"] >= since} for r in replicas]
            assert all(s for s in steps), f"a replica of stage {stage} stopped stepping"
            common = set.intersection(*(set(s) for s in steps))
            assert common, f"stage {stage}: no common iteration since {since}"
            for t in common:
                assert len({s[t] for s in steps}) == 1, f"stage {stage} replicas diverged at iteration {t}"

    def excluded_in_status(self, peer: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """``peer``'s exclusion as ``gwtf status`` shows it (records are published every heartbeat)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = {e["peer"]: e for e in self.status()["excluded"]}
            if peer in found or time.monotonic() > deadline:
                assert peer in found, f"gwtf status shows no exclusion of {peer}: {found}"
                return found[peer]
            time.sleep(1.0)

    def status(self) -> dict[str, Any]:
        """What ``gwtf status --json`` shows, read through the data holder (in this process: the CLI's
        imports take a minute on two busy cores)."""
        from gwtfp2p.daemon.status import read_swarm, summarize

        return summarize(run_async(read_swarm((self.dh.maddr,), timeout_s=60.0), timeout_s=90.0))


def logged(daemon: Daemon, text: str) -> bool:
    return text in daemon.stderr_path.read_text(errors="replace")


def wait_logged(daemon: Daemon, text: str, timeout_s: float) -> None:
    """Until ``daemon`` logged ``text`` (its stderr file is the only signal), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not logged(daemon, text):
        assert time.monotonic() < deadline, f"{daemon.name} never logged {text!r}"
        assert daemon.popen.poll() is None, f"{daemon.name} exited: {daemon.stderr_tail()}"
        time.sleep(0.2)


class Mallory:
    """A hostile volunteer process (``tests.adversarial.mallory``) taking one command at a time: forked from
    the session's zygote, which imported torch and hivemind once (a fresh interpreter spends most of a
    minute on them while the honest swarm keeps both cores busy), or a fresh one with ``$GWTF_LOCAL_FORK=0``."""

    def __init__(self, bootstrap: str, stderr_path: Path) -> None:
        env = {**os.environ, "GWTF_HIVEMIND_LOG_LEVEL": "CRITICAL"}
        self.stderr_path = stderr_path
        with open(stderr_path, "wb") as stderr:
            if os.environ.get(FORK_ENV, "1") != "0":
                self.popen: subprocess.Popen | ForkedProcess = SESSION_ZYGOTES.spawn_module(
                    MALLORY_MODULE, [bootstrap], stderr, str(REPO_ROOT), env)
            else:
                self.popen = subprocess.Popen([sys.executable, "-m", MALLORY_MODULE, bootstrap], cwd=REPO_ROOT,
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                              start_new_session=True, env=env)
        self.peer_id = self._line(90.0)["peer_id"]

    def _line(self, timeout_s: float) -> dict[str, Any]:
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if select.select([self.popen.stdout], [], [], 0.2)[0]:
                line = self.popen.stdout.readline()
                if line.startswith(b"{"):
                    return json.loads(line)
            if self.popen.poll() is not None:
                raise RuntimeError(f"mallory exited with code {self.popen.returncode}: {self.stderr_tail()}")
        raise TimeoutError(f"mallory did not answer within {timeout_s:.0f} s: {self.stderr_tail()}")

    def stderr_tail(self, chars: int = 2000) -> str:
        return self.stderr_path.read_text(errors="replace")[-chars:]

    def do(self, command: str, timeout_s: float = 120.0, **args: Any) -> Any:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps({"do": command, **args}).encode() + b"\n")
        self.popen.stdin.flush()
        return self._line(timeout_s)["result"]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()


def spawn_hostile_relay(honest: Honest, name: str, stage: int, behaviour: str, *args: str) -> Daemon:
    """A volunteer running a modified daemon (``$GWTF_MISBEHAVE``) that joins stage ``stage``."""
    return honest.swarm.spawn_relay(name, str(stage), *args, env={"GWTF_MISBEHAVE": behaviour}).wait_ready(120)


def stop(daemon: Daemon) -> None:
    """SIGKILL a hostile daemon: the honest ones find it dead and go on."""
    daemon.kill_group()
