"""``gwtf demo --serve 0 --metrics-port-base P``: while the local swarm trains, the status page it prints
serves the swarm (``/status.json``: every node, the routing) and every node serves its metrics on P, P+1,
P+2, whose iteration moves; when the demo ends, the page is gone and the exit code is 0."""

from __future__ import annotations

import json
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from tests.deadlines import scaled
from tests.integration.swarm import REPO_ROOT
from tests.integration.test_metrics import scrape, value

pytestmark = pytest.mark.timeout(420)  # a whole demo on two shared cores (164 and 220 s at load averages around 20)
LINE_TIMEOUT_S = scaled(150.0)


def free_port_run(count: int) -> int:
    """A port P with P..P+count-1 free, below the kernel's ephemeral range (32768+): nothing else here
    takes ports there unasked (the daemons' own listen on ephemeral ports)."""
    for base in range(21000, 32000 - count, 97):
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError("no free run of ports")


class Lines:
    """The demo's stdout, line by line, from a reader thread; ``iteration``: the last one it printed."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.iteration = -1
        threading.Thread(target=self._read, args=(popen,), daemon=True).start()

    def _read(self, popen: subprocess.Popen) -> None:
        for line in popen.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    def next(self, timeout_s: float, what: str) -> str | None:
        """The next line within ``timeout_s`` (None if none came)."""
        try:
            line = self.queue.get(timeout=max(0.01, timeout_s))
        except queue.Empty:
            return None
        if line is None:
            raise AssertionError(f"the demo ended before {what}: {self.seen[-20:]}")
        self.seen.append(line)
        match = re.match(r"iteration\s+(\d+)\s+loss", line)
        if match:
            self.iteration = int(match.group(1))
        return line

    def until(self, match: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + LINE_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.next(deadline - time.monotonic(), what)
            if line is not None and match(line):
                return line
        raise AssertionError(f"no {what} within {LINE_TIMEOUT_S} s: {self.seen[-20:]}")

    def until_iteration(self, iteration: int) -> None:
        if self.iteration < iteration:
            self.until(lambda _line: self.iteration >= iteration, f"iteration {iteration}")


def fetch_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


def test_demo_serves_its_page_and_its_nodes_metrics() -> None:
    base = free_port_run(3)
    popen = subprocess.Popen([sys.executable, "-m", "gwtf_cli.main", "demo", "--iterations", "60",
                              "--relays-per-stage", "1", "--serve", "0", "--metrics-port-base", str(base)],
                             cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        lines = Lines(popen)
        url = lines.until(lambda line: line.startswith("status page: "), "the page's URL").split()[2]
        lines.until(lambda _: sum(" joined stage " in seen for seen in lines.seen) == 2, "both relays")
        ports = sorted(int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)/metrics", "\n".join(lines.seen)))
        assert ports == [base, base + 1, base + 2], lines.seen
        lines.until_iteration(2)
        first = {port: scrape(port) for port in ports}
        deadline = time.monotonic() + 60
        while True:  # the page's poller reads the DHT every 2 s: until it saw the three nodes and routing
            status, summary = fetch_json(url + "status.json")
            if status == 200 and len(summary["nodes"]) == 3 and summary["routing"]:
                break
            assert time.monotonic() < deadline, (status, summary)
            lines.next(1.0, "the page's first reads")  # paced by the demo's output (or a second)
        assert summary["live"]["reads"] >= 1 and summary["unserved_stages"] == []
        assert {n["stage"] for n in summary["nodes"]} == {0, 1, 2}
        lines.until_iteration(lines.iteration + 6)
        for port in ports:
            later = scrape(port)
            assert value(later, "gwtf_iteration") > value(first[port], "gwtf_iteration"), port
            assert (value(later, "gwtf_microbatches_forwarded_total")
                    > value(first[port], "gwtf_microbatches_forwarded_total")), port
        assert popen.wait(timeout=200) == 0, popen.stderr.read()[-2000:]
        with pytest.raises(urllib.error.URLError):  # the page stopped with the demo
            urllib.request.urlopen(url + "status.json", timeout=5)
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait(timeout=10)
