"""Prometheus metrics of running daemons, and ``gwtf join``'s live screen on a real terminal (a pty).

A local swarm (a data holder and one relay per stage, one of them started on a pty so that it shows its
live screen) trains; ``/metrics`` of every node is scraped twice and the counters must have moved with
training in between. The endpoint itself: its deadlines (a silent or oversized request is dropped, the
others are served meanwhile), its connection limit, a taken port, and ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gwtfp2p.config import ConfigError
from gwtfp2p.daemon.lifecycle.metrics import StartupMetrics
from gwtfp2p.daemon.lifecycle.metrics_http import MAX_CONNECTIONS, MetricsEndpoint
from gwtfp2p.daemon.progress import NodeProgress
from tests.deadlines import scaled
from tests.integration.churn_support import tiny_spec, write_spec
from tests.integration.conftest import run_async
from tests.integration.swarm import FAST, REPO_ROOT, Swarm

pytestmark = pytest.mark.timeout(300)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
SCREEN_TIMEOUT_S = scaled(120.0)


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
        body = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def labelled(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


class Terminal:
    """A process on a pseudo-terminal of 120 x 50 characters; ``text`` is all it drew, ANSI codes removed.
    Everything it draws is also appended to ``transcript`` as it comes (kept with a failed test's folder)."""

    def __init__(self, args: list[str], transcript: Path) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "50"}
        self.popen = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=REPO_ROOT, env=env,
                                      start_new_session=True, close_fds=True)
        os.close(slave)
        self._master = master
        self._transcript = transcript.open("ab")
        self._raw: list[bytes] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: the other side is closed
                chunk = b""
            with self._changed:
                if chunk and not self._transcript.closed:
                    self._raw.append(chunk)
                    self._transcript.write(chunk)
                    self._transcript.flush()
                self._changed.notify_all()
            if not chunk:
                return

    @property
    def text(self) -> str:
        with self._changed:
            return ANSI.sub("", b"".join(self._raw).decode(errors="replace"))

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                match = re.search(pattern, ANSI.sub("", b"".join(self._raw).decode(errors="replace")))
                if match:
                    return match
                remaining, code = deadline - time.monotonic(), self.popen.poll()
                if code is not None:
                    raise AssertionError(f"the screen's process exited with {code} before it showed {pattern!r}; "
                                         f"it showed:\n{self.text[-3000:]}")
                if remaining <= 0:
                    raise AssertionError(f"the screen never showed {pattern!r} within {timeout_s:.0f} s; "
                                         f"it showed:\n{self.text[-3000:]}")
                self._changed.wait(min(remaining, 1.0))

    def close(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        os.close(self._master)
        with self._changed:
            self._transcript.close()


@contextlib.contextmanager
def terminal(args: list[str], transcript: Path) -> Iterator[Terminal]:
    term = Terminal(args, transcript)
    try:
        yield term
    finally:
        term.close()


def check_moved(before: Samples, after: Samples, name: str, role: str, stage: int) -> None:
    """What training must have changed on one node between two scrapes."""
    def grew(metric: str, **labels: str) -> bool:
        return value(after, metric, **labels) > value(before, metric, **labels)

    info = next(iter(labelled(after, "gwtf_node_info")))
    assert dict(info)["role"] == role and dict(info)["stage"] == str(stage), (name, info)
    assert value(after, "gwtf_node_state", state="online") == 1, name
    for metric in ("gwtf_iteration", "gwtf_steps_total", "gwtf_microbatches_forwarded_total",
                   "gwtf_microbatches_backwarded_total", "gwtf_compute_busy_seconds_total",
                   "process_cpu_seconds_total"):
        assert grew(metric), (name, metric, value(before, metric), value(after, metric))
    for kind in ("forward", "backward", "message"):
        assert grew("gwtf_received_bytes_total", kind=kind), (name, kind)
    for kind in ("forward", "backward"):
        assert grew("gwtf_sent_bytes_total", kind=kind) and grew("gwtf_sent_messages_total", kind=kind), (name, kind)
    for phase in ("gather", "step"):
        assert grew("gwtf_aggregation_seconds_count", phase=phase), (name, phase)
    loss = value(after, "gwtf_loss")
    assert math.isfinite(loss) and 0 < loss < 10, (name, loss)
    assert value(after, "gwtf_tokens_per_second") > 0 and value(after, "gwtf_flow_units") > 0, name
    units_out, costs = labelled(after, "gwtf_flow_units_out"), labelled(after, "gwtf_edge_cost_seconds")
    rtts = labelled(after, "gwtf_link_rtt_seconds")
    assert units_out and labelled(after, "gwtf_flow_units_in"), name
    for labels in units_out:  # every next hop that gets units has a measured link and an edge cost
        peer = dict(labels)["peer"]
        assert rtts[(("peer", peer),)] > 0, (name, peer)
        assert any(dict(c)["peer"] == peer and v > 0 for c, v in costs.items()), (name, peer, costs)
    assert value(after, "gwtf_recomputed_hops_total") == 0 and not labelled(after, "gwtf_recoveries_total"), name


@pytest.mark.timeout(420)  # three daemons on two shared cores; one of them a fresh interpreter on a pty
def test_metrics_move_with_training_and_the_live_screen_follows_a_relay(tmp_path: Path) -> None:
    started = time.monotonic()
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(tiny_spec(), tmp_path / "spec.json"),
                                     "--min-nodes", "3", "--metrics-port", "0")
        relay = swarm.spawn_relay("r1", "1", "--metrics-port", "0")
        args = [sys.executable, "-m", "gwtf_cli.join_cmd", *FAST, "--log-level", "WARNING", "--stage", "2",
                "--initial-peers", dh.maddr, "--metrics-port", "0"]
        with terminal(args, tmp_path / "screen.log") as screen:
            relay.wait_ready()
            port = int(screen.wait_for(r"metrics on port (\d+)", SCREEN_TIMEOUT_S).group(1))
            ports = {"dh0": (dh.ready["metrics_port"], "data", 0), "r1": (relay.ready["metrics_port"], "relay", 1),
                     "screen": (port, "relay", 2)}
            first = dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= 2, 120, "iteration 2")
            print(f"training after {time.monotonic() - started:.0f} s")
            before = {name: scrape(p) for name, (p, _, _) in ports.items()}
            dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= first["iteration"] + 4, 120,
                        "4 more iterations")
            after = {name: scrape(p) for name, (p, _, _) in ports.items()}
            for name, (_, role, stage) in ports.items():
                check_moved(before[name], after[name], name, role, stage)
            holder = after["dh0"]  # a data holder counts its microbatches per closed iteration: 4 each
            assert value(holder, "gwtf_microbatches_forwarded_total") == 4 * value(holder, "gwtf_steps_total")
            for name in ("r1", "screen"):  # a relay computes every forward it receives, at most an iteration's later
                queued = (value(after[name], "gwtf_received_messages_total", kind="forward")
                          - value(after[name], "gwtf_microbatches_forwarded_total"))
                assert 0 <= queued <= tiny_spec().microbatches_per_dh, (name, queued)

            shown = screen.wait_for(r"iteration\s+loss", 60) and screen.text
            assert "start-up" in shown and "joining the DHT" in shown  # the phases' progress bar while it started
            assert re.search(r"relay …\w{6} · stage 2 \(.*\) · online", shown), shown[-3000:]
            assert relay.peer_id[-6:] in shown and dh.peer_id[-6:] in shown  # its flow neighbours
            assert "--initial-peers /ip4/127.0.0.1/tcp/" in shown.replace("\n", "")
            screen.popen.send_signal(signal.SIGINT)  # a graceful leave, shown, then exit 0
            assert screen.popen.wait(timeout=60) == 0, screen.text[-3000:]
            assert re.search(r"leaving at iteration \d+", screen.text) and "stopped" in screen.text
    finally:
        swarm.close()


def test_the_endpoint_bounds_every_connection() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StartupMetrics(NodeProgress()))
        endpoint = await MetricsEndpoint.start("127.0.0.1", 0, registry, request_timeout_s=0.5)
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            silent = await asyncio.open_connection("127.0.0.1", endpoint.port)
            began = time.monotonic()
            assert (await get(endpoint.port, "/metrics")).startswith(b"HTTP/1.1 200 OK")  # served meanwhile
            assert await asyncio.wait_for(silent[0].read(), 5) == b""  # dropped, unanswered, at the deadline
            assert 0.4 < time.monotonic() - began < 3
            huge = await asyncio.open_connection("127.0.0.1", endpoint.port)
            huge[1].write(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000)
            assert await asyncio.wait_for(huge[0].read(), 5) == b""  # too long: no answer
            assert (await get(endpoint.port, "/nothing")).startswith(b"HTTP/1.1 404")
            held += [await asyncio.open_connection("127.0.0.1", endpoint.port) for _ in range(MAX_CONNECTIONS)]
            while endpoint.open_connections < MAX_CONNECTIONS:  # until the server took them all
                await asyncio.sleep(0)
            extra = await asyncio.open_connection("127.0.0.1", endpoint.port)
            assert await asyncio.wait_for(extra[0].read(), 5) == b""  # over the limit: closed at once
            assert endpoint.open_connections == MAX_CONNECTIONS
            with pytest.raises(ConfigError, match="--metrics-port"):
                await MetricsEndpoint.start("127.0.0.1", endpoint.port, registry)
        finally:
            await endpoint.close()
        for reader, _ in held:  # close drops the connections still open
            assert await asyncio.wait_for(reader.read(), 5) == b""

    run_async(scenario(), timeout_s=60)


async def get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer
