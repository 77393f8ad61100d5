"""Local swarms: real ``gwtf join --json`` daemons on 127.0.0.1 (``gwtf demo``, tests, benchmarks).

Each daemon runs in its own process group (``start_new_session``) and dies with its parent
(``PR_SET_PDEATHSIG``, Linux), so nothing outlives a demo or test even if it is SIGKILLed. The
signal fires when the *thread* that forked the child exits, so every daemon is forked by one
spawner thread that lives as long as the process (a chaos driver's thread may come and go); a
reader thread collects its events, so callers wait on events (``wait_for``) instead of sleeping.
``close`` sends SIGTERM (graceful leave) and then SIGKILLs every group. Daemons are forked from a
zygote that imported torch, hivemind and transformers once (``zygote``): a swarm starts in seconds
instead of paying those imports per process (``$GWTF_LOCAL_FORK=0``: a fresh interpreter each).
A swarm's ``deadline_factor`` multiplies every wait on its daemons' events (slow machines: tests
set it from ``$GWTF_TEST_DEADLINE_FACTOR``, docs/testing.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from gwtfp2p.localswarm.zygote import ForkedProcess, ZygoteClient

FAST = ("--tick-s", "0.25", "--heartbeat-s", "2", "--grace-s", "5")
Event = dict[str, Any]
READY_TIMEOUT_S = 90.0
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gwtf-spawner")  # never shut down: see above
FORK_ENV = "GWTF_LOCAL_FORK"  # 0: every daemon is a fresh interpreter instead of a fork of the zygote


class Zygotes:
    """The preloaded parent of one swarm's daemons, started (again, if it died) on the spawner thread.
    Several swarms may share one (a test session's: ``start`` it first, ``close`` it at the end)."""

    def __init__(self) -> None:
        self._current: ZygoteClient | None = None

    def start(self) -> None:
        """Start it now, on the spawner thread (its children's death signal follows that thread)."""
        _SPAWNER.submit(self.get).result()

    def get(self) -> ZygoteClient:
        if self._current is None or not self._current.alive():
            self._current = ZygoteClient()
        return self._current

    def spawn_module(self, module: str, args: list[str], stderr: IO[bytes], cwd: str | None,
                     env: dict[str, str]) -> ForkedProcess:
        """``python -m MODULE ARGS`` forked from the zygote (asked on the spawner thread), a pipe on its stdin."""
        return _SPAWNER.submit(lambda: self.get().spawn(args, stderr, cwd, env, module=module)).result()

    def close(self) -> None:
        if self._current is not None:
            _SPAWNER.submit(self._current.close).result()
            self._current = None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (async-signal-safe: one syscall)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (Linux: read from /proc)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == pgid:  # after "pid (comm)": state, ppid, pgrp
            members.append(int(entry.name))
    return members


class Daemon:
    """One ``gwtf join --json`` process and the events it printed."""

    def __init__(self, name: str, args: list[str], log_dir: Path, cwd: Path | None = None,
                 env: dict[str, str] | None = None, zygotes: Zygotes | None = None,
                 deadline_factor: float = 1.0) -> None:
        self.name = name
        self.deadline_factor = deadline_factor  # multiplies every timeout_s of the waits below
        self.args = args
        self.stderr_path = log_dir / f"{name}.stderr"
        self.started_at = time.time()
        self.zygotes = zygotes
        self.popen = _SPAWNER.submit(self._spawn, args, cwd, env).result()
        self.events: list[Event] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.ready: Event = {}

    def _spawn(self, args: list[str], cwd: Path | None,
               env: dict[str, str] | None) -> subprocess.Popen | ForkedProcess:
        """On the spawner thread: fork from the preloaded zygote, or start a fresh interpreter."""
        with open(self.stderr_path, "wb") as stderr:
            if self.zygotes is not None and os.environ.get(FORK_ENV, "1") != "0":
                return self.zygotes.get().spawn(["--json", *args], stderr, str(cwd) if cwd else None,
                                       {**os.environ, **(env or {})})
            return subprocess.Popen([sys.executable, "-m", "gwtf_cli.join_cmd", "--json", *args],
                                    cwd=cwd, stdout=subprocess.PIPE, stderr=stderr,
                                    env={**os.environ, **env} if env else None,
                                    start_new_session=True, preexec_fn=_die_with_parent)

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[Event], bool], timeout_s: float, what: str = "") -> Event:
        """The first event satisfying ``predicate`` (already seen or to come); TimeoutError past the deadline."""
        timeout_s *= self.deadline_factor
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while True:
                for event in self.events[seen:]:
                    if predicate(event):
                        return event
                seen = len(self.events)
                if self.popen.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError(f"{self.name} exited ({self.popen.returncode}) waiting for {what}: "
                                       f"{self.stderr_tail()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.name}: no {what or 'matching event'} within {timeout_s:.0f} s; "
                                       f"stderr: {self.stderr_tail()}")
                self._changed.wait(min(remaining, 0.5))

    def next_event(self, names: tuple[str, ...], cursor: int, timeout_s: float) -> tuple[Event, int]:
        """The first event named in ``names`` at or after position ``cursor``, and the next cursor."""
        timeout_s *= self.deadline_factor
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for position in range(cursor, len(self.events)):
                    if self.events[position].get("event") in names:
                        return self.events[position], position + 1
                cursor = len(self.events)
                if self.popen.poll() is not None and not self._reader.is_alive():
                    raise RuntimeError(f"{self.name} exited ({self.popen.returncode}): {self.stderr_tail()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.name}: no {'/'.join(names)} event within {timeout_s:.0f} s")
                self._changed.wait(min(remaining, 0.5))

    def wait_event(self, name: str, timeout_s: float, **fields: Any) -> Event:
        return self.wait_for(lambda e: e.get("event") == name and all(e.get(k) == v for k, v in fields.items()),
                             timeout_s, f"{name} {fields}")

    def of(self, name: str) -> list[Event]:
        with self._changed:
            return [e for e in self.events if e.get("event") == name]

    def of_all(self) -> list[Event]:
        with self._changed:
            return list(self.events)

    def wait_ready(self, timeout_s: float = 90.0) -> Daemon:
        self.ready = self.wait_event("ready", timeout_s)
        return self

    @property
    def peer_id(self) -> str:
        return self.ready["peer_id"]

    @property
    def maddr(self) -> str:
        return self.ready["maddrs"][0]

    def stderr_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def signal_group(self, sig: int, group: bool = True) -> None:
        """Send ``sig`` to the daemon (or its whole process group). Once it was reaped, its pid may belong
        to another process by now (pids wrap around quickly): then only the members its group still has
        (an orphaned DHT child holding our stdout pipe; the kernel reuses no pid that is a live group's id)."""
        if self.popen.returncode is not None:  # reaped (poll/wait): never signal its pid again
            if group:
                for member in group_members(self.popen.pid):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(member, sig)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            (os.killpg if group else os.kill)(self.popen.pid, sig)

    def terminate(self) -> None:
        self.signal_group(signal.SIGTERM, group=False)

    def kill_group(self) -> None:
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


class Swarm:
    """Daemons of one demo or test; ``close`` stops them all (SIGTERM, then SIGKILL of every group)."""

    def __init__(self, log_dir: Path, common: tuple[str, ...] = FAST, cwd: Path | None = None,
                 zygotes: Zygotes | None = None, deadline_factor: float = 1.0) -> None:
        """``zygotes``: a preloaded parent shared with other swarms (left running by ``close``); by
        default the swarm starts its own with its first daemon. ``deadline_factor`` (> 0) multiplies
        every wait on its daemons' events."""
        if not (deadline_factor > 0 and deadline_factor < float("inf")):
            raise ValueError(f"deadline_factor must be a positive finite number, got {deadline_factor!r}")
        self.deadline_factor = deadline_factor
        self.log_dir = log_dir
        self.common = common
        self.cwd = cwd
        self.daemons: list[Daemon] = []
        self.zygotes = zygotes or Zygotes()
        self._own_zygotes = zygotes is None

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> Daemon:
        """Start a daemon without waiting for it (``Daemon.wait_ready`` does); ``env`` adds variables."""
        daemon = Daemon(name, [*self.common, *args], self.log_dir, self.cwd, env, self.zygotes, self.deadline_factor)
        self.daemons.append(daemon)
        return daemon

    def start(self, name: str, *args: str, wait_ready_s: float = READY_TIMEOUT_S) -> Daemon:
        return self.spawn(name, *args).wait_ready(wait_ready_s)

    def bootstrap_args(self) -> tuple[str, ...]:
        return ("--initial-peers", self.daemons[0].maddr) if self.daemons else ()

    def start_data_holder(self, name: str = "dh0", *args: str) -> Daemon:
        return self.start(name, "--role", "data", *self.bootstrap_args(), *args)

    def spawn_relay(self, name: str, stage: str, *args: str, env: dict[str, str] | None = None) -> Daemon:
        return self.spawn(name, "--stage", stage, *self.bootstrap_args(), *args, env=env)

    def start_relay(self, name: str, stage: str, *args: str) -> Daemon:
        return self.spawn_relay(name, stage, *args).wait_ready(READY_TIMEOUT_S)

    def save_events(self) -> None:
        """Every daemon's events as JSON lines beside its log (``NAME.events.jsonl``): kept logs are read with
        what each daemon reported (its peer id, stage, steps, recoveries), not only what it logged."""
        for daemon in self.daemons:
            with open(self.log_dir / f"{daemon.name}.events.jsonl", "a", encoding="utf-8") as out:
                out.writelines(json.dumps(e) + "\n" for e in daemon.of_all())

    def close(self, grace_s: float = 10.0) -> None:
        for daemon in self.daemons:
            daemon.terminate()
        deadline = time.monotonic() + grace_s
        for daemon in self.daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        for daemon in self.daemons:
            daemon.kill_group()
        if self._own_zygotes:
            self.zygotes.close()
