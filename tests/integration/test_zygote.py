"""The zygote local swarms fork their daemons from: a child runs ``gwtf join`` with the arguments,
environment, directory, stdout and stderr it was given, in its own session, and its exit status comes
back as ``Popen.returncode`` does (a code, or minus the signal); closing the zygote leaves nothing. Another
module runs as ``python -m`` would run it, with a pipe on its stdin."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gwtfp2p.localswarm.zygote import ZygoteClient

pytestmark = pytest.mark.timeout(180)


def test_children_get_their_arguments_streams_and_statuses(tmp_path: Path) -> None:
    zygote = ZygoteClient()
    try:
        with open(tmp_path / "bad.stderr", "wb") as stderr:
            bad = zygote.spawn(["--json", "--role", "nobody"], stderr, str(tmp_path), {**os.environ})
        assert bad.wait(timeout=120) == 2  # a config error: the flag is named
        assert "--role" in (tmp_path / "bad.stderr").read_text()

        with open(tmp_path / "dh.stderr", "wb") as stderr:
            dh = zygote.spawn(["--json", "--role", "data", "--heartbeat-s", "2"], stderr, str(tmp_path),
                              {**os.environ, "GWTF_DELAY_AT": "nowhere:1"})
        assert dh.wait(timeout=120) != 0  # the environment it was given is the one it reads
        assert "GWTF_DELAY_AT" in (tmp_path / "dh.stderr").read_text()

        with open(tmp_path / "ok.stderr", "wb") as stderr:
            ok = zygote.spawn(["--json", "--role", "data", "--heartbeat-s", "2"], stderr, str(tmp_path),
                              {**os.environ})
        line = ok.stdout.readline()
        assert b'"event"' in line and os.getpgid(ok.pid) == ok.pid  # its own session and process group
        os.killpg(ok.pid, signal.SIGKILL)
        assert ok.wait(timeout=60) == -signal.SIGKILL
    finally:
        zygote.close()
    assert zygote.process.returncode is not None


def test_a_module_gets_its_stdin_and_exits_with_its_own_status(tmp_path: Path) -> None:
    zygote = ZygoteClient()
    try:
        with open(tmp_path / "tool.stderr", "wb") as stderr:
            tool = zygote.spawn([], stderr, str(tmp_path), {**os.environ}, module="json.tool")
        assert tool.stdin is not None
        tool.stdin.write(b'{"stage": 1}')
        tool.stdin.close()  # end of input: python -m json.tool prints the object and exits
        assert tool.stdout.read() == b'{\n    "stage": 1\n}\n'
        assert tool.wait(timeout=60) == 0

        with open(tmp_path / "bad.stderr", "wb") as stderr:
            bad = zygote.spawn([], stderr, str(tmp_path), {**os.environ}, module="json.tool")
        bad.stdin.write(b"not json")
        bad.stdin.close()
        assert bad.wait(timeout=60) != 0 and "Expecting value" in (tmp_path / "bad.stderr").read_text()
    finally:
        zygote.close()


def test_a_child_killed_holding_hiveminds_lock_does_not_wedge_the_next(tmp_path: Path) -> None:
    """hivemind's process-wide locks are created when the zygote imports it; a daemon SIGKILLed holding
    ``MPFuture``'s update lock left every daemon forked after it unable to report its DHT ready (60 s, then
    "the DHT did not start"): each child now takes fresh locks (``dht/forking.py``)."""
    zygote = ZygoteClient()
    try:
        with open(tmp_path / "hold.stderr", "wb") as stderr:
            holder = zygote.spawn(["hold"], stderr, os.getcwd(), {**os.environ}, module="tests.integration.lockholder")
        assert holder.wait(timeout=60) == -signal.SIGKILL, (tmp_path / "hold.stderr").read_text()
        with open(tmp_path / "take.stderr", "wb") as stderr:
            taker = zygote.spawn(["take"], stderr, os.getcwd(), {**os.environ}, module="tests.integration.lockholder")
        assert taker.wait(timeout=60) == 0, (tmp_path / "take.stderr").read_text()  # 3: the lock stayed taken
    finally:
        zygote.close()
