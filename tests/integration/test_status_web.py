"""``gwtf status --serve``: the live page in a real headless browser (Debian's chromium, driven by
Playwright; nothing is installed here), against a live local swarm and a simulated one of 100 nodes;
and the HTTP server itself (endpoints, a failed read, clean shutdown).

Against the swarm: the graph has one box per live replica and one curve per routed pair, matching
``gwtf status --json``; a SIGKILLed relay is marked crashed within 10 s. ``GWTF_SCREENSHOT_DIR`` (if
set) receives screenshots of the page (docs/img/ has the ones docs/status.md shows).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from gwtf_cli.web import serve_status
from tests.deadlines import scaled
from tests.integration.churn_support import tiny_spec, write_spec
from tests.integration.swarm import REPO_ROOT, Swarm
from tests.integration.test_daemon_placement import gwtf_status

pytestmark = pytest.mark.timeout(300)
CHROMIUM = "/usr/bin/chromium"
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVE_READY_TIMEOUT_S = scaled(90.0)
CRASH_MARKED_WITHIN_S = 10.0  # what the page promises: not scaled
SHUTDOWN_TIMEOUT_S = scaled(30.0)


@contextlib.contextmanager
def browser_page(profile: Path, width: int = 1600, height: int = 1000) -> Iterator[Page]:
    """A page of a fresh headless chromium (its own profile directory), closed at exit. ``bypass_csp``: the
    page forbids eval, which Playwright's wait_for_function uses; the page itself runs under its policy."""
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, args=BROWSER_ARGS, headless=True, bypass_csp=True,
            viewport={"width": width, "height": height})
        try:
            page = context.new_page()
            page.set_default_timeout(scaled(30_000))
            yield page
        finally:
            context.close()


@contextlib.contextmanager
def status_server(*args: str) -> Iterator[str]:
    """``gwtf status --serve --port 0 ARGS``: yields its URL once it prints it; at exit Ctrl-C (SIGINT)
    must stop it cleanly (exit 0) within ``SHUTDOWN_TIMEOUT_S``."""
    popen = subprocess.Popen([sys.executable, "-m", "gwtf_cli.main", "status", "--serve", "--port", "0", *args],
                             cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        ready, _, _ = select.select([popen.stdout], [], [], SERVE_READY_TIMEOUT_S)
        line = popen.stdout.readline() if ready else ""
        if "serving http://" not in line:
            popen.kill()
            raise AssertionError(f"no URL from gwtf status --serve: {line!r}; stderr: {popen.communicate()[1][-2000:]}")
        yield line.split("serving ", 1)[1].split()[0]
        popen.send_signal(signal.SIGINT)
        _, err = popen.communicate(timeout=SHUTDOWN_TIMEOUT_S)
        assert popen.returncode == 0, err[-2000:]
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(timeout=10)


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def drawn(page: Page) -> dict[str, Any]:
    """What the page shows now: the JSON it rendered, its graph's boxes and curves."""
    return page.evaluate("""() => ({
        data: window.gwtf.last,
        nodes: [...document.querySelectorAll('#graph g.node:not(.sink)')].map(g => g.dataset.peer),
        crashed: [...document.querySelectorAll('#graph g.node.crashed:not(.sink)')].map(g => g.dataset.peer),
        edges: [...document.querySelectorAll('#graph path.edge')].map(p => [p.dataset.from, p.dataset.to]),
        svgVersion: document.querySelector('#graph svg').dataset.version,
    })""")


def pairs(summary: dict[str, Any]) -> set[tuple[str, str]]:
    return {(r["from"], r["to"]) for r in summary["routing"]}


def wait_for_version_after(page: Page, version: int) -> dict[str, Any]:
    page.wait_for_function(f"window.gwtf.version > {version}")
    return drawn(page)


def save(page: Page, name: str) -> None:
    folder = os.environ.get("GWTF_SCREENSHOT_DIR")
    if folder:
        page.screenshot(path=str(Path(folder) / name), full_page=True)


@pytest.mark.timeout(420)  # four daemons, the status server, chromium and `gwtf status --json` on 2 cores
def test_page_follows_a_live_swarm_and_marks_a_killed_relay(tmp_path: Path) -> None:
    started = time.monotonic()
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(tiny_spec(), tmp_path / "spec.json"),
                                     "--min-nodes", "4")
        relays = [swarm.spawn_relay(name, stage) for name, stage in (("r1a", "1"), ("r1b", "1"), ("r2", "2"))]
        for relay in relays:
            relay.wait_ready()
        dh.wait_for(lambda e: e.get("event") == "iteration" and e["units"] == 4, 120, "4 units routed")
        with status_server("--initial-peers", dh.maddr, "--interval-s", "1") as url, \
                browser_page(tmp_path / "chromium") as page:
            print(f"swarm training and the page served after {time.monotonic() - started:.0f} s")
            page.goto(url)
            page.wait_for_function("document.body.dataset.graph === 'drawn' && window.gwtf.last.nodes.length === 4"
                                   " && window.gwtf.last.routing.length > 0", timeout=scaled(60_000))
            shown = drawn(page)
            rendered = shown["data"]
            assert shown["svgVersion"] == str(rendered["live"]["version"])
            assert sorted(shown["nodes"]) == sorted(n["peer_id"] for n in rendered["nodes"])
            assert sorted(shown["nodes"]) == sorted(d.peer_id for d in swarm.daemons)
            assert sorted(map(tuple, shown["edges"])) == sorted(pairs(rendered))  # one curve per routed pair

            # the routing of one read matches the CLI's read; it may move between two reads (on a loaded machine
            # the flow re-routes for a while after the start): read both again, for at most 90 s
            agree_by = time.monotonic() + scaled(90.0)
            for attempt in range(1000):  # noqa: B007 (printed after the loop)
                cli = json.loads(gwtf_status(dh.maddr, "--json"))
                shown = wait_for_version_after(page, shown["data"]["live"]["version"])
                if pairs(cli) == {tuple(e) for e in shown["edges"]} or time.monotonic() > agree_by:
                    break
            print(f"page and gwtf status --json agree (attempt {attempt + 1}) after {time.monotonic() - started:.0f} s")
            assert {tuple(e) for e in shown["edges"]} == pairs(cli)
            assert sorted(shown["nodes"]) == sorted(n["peer_id"] for n in cli["nodes"])
            status, _, body = get(url + "status.json")
            served = json.loads(body)
            assert status == 200 and set(cli) <= set(served) and "live" in served  # a superset of status --json
            assert all(type(served[k]) is type(cli[k]) for k in cli if cli[k] is not None)
            save(page, "status-live-swarm.png")

            victim = relays[1]
            victim.kill_group()
            killed_at = time.monotonic()
            page.wait_for_function(f"document.querySelector('#graph g.node.crashed[data-peer=\"{victim.peer_id}\"]')",
                                   timeout=CRASH_MARKED_WITHIN_S * 1000)
            marked_s = time.monotonic() - killed_at
            print(f"killed relay marked crashed on the page after {marked_s:.1f} s")
            shown = drawn(page)
            assert shown["crashed"] == [victim.peer_id]
            assert victim.peer_id not in {n["peer_id"] for n in shown["data"]["nodes"]}
            events = page.locator("#events li[data-kind=crash]").all_inner_texts()
            assert any(victim.peer_id[-6:] in text for text in events), events
            save(page, "status-live-swarm-crash.png")
    finally:
        swarm.close()


def test_page_with_100_simulated_nodes(tmp_path: Path) -> None:
    with status_server("--simulate", "100", "--interval-s", "0.5") as url, \
            browser_page(tmp_path / "chromium") as page:
        page.goto(url)
        page.wait_for_function("window.gwtf.renders.length >= 6")
        shown = drawn(page)
        listed = {n["peer_id"] for n in shown["data"]["nodes"]}
        assert len(listed) == 100 and listed <= set(shown["nodes"])
        assert set(shown["nodes"]) - listed <= set(shown["crashed"])  # one gone since the last frame stays, marked
        assert {tuple(e) for e in shown["edges"]} == pairs(shown["data"])
        assert page.locator("#stages tbody tr").count() == shown["data"]["spec"]["n_stages"] + 1
        assert page.locator("#sync-problems li").count() >= 2  # the simulated diverged and lagging replicas
        renders = page.evaluate("window.gwtf.renders")
        times = [r["total_ms"] for r in renders[1:]]
        print(f"100 nodes: render {statistics.median(times):.0f} ms median, {max(times):.0f} ms max "
              f"over {len(times)} updates")
        save(page, "status-simulated-100.png")


def test_server_endpoints_a_failed_read_and_close() -> None:
    from gwtf_cli.web.simulated import SimulatedSwarm
    from gwtfp2p.daemon.status import NoRunError

    simulated = SimulatedSwarm(12, seed=5)
    outcomes: queue.Queue[Exception | None] = queue.Queue()
    closing = threading.Event()

    def read_summary() -> dict[str, Any]:  # each read waits for the test to say how it ends
        while True:
            try:
                outcome = outcomes.get(timeout=0.1)
                break
            except queue.Empty:
                if closing.is_set():
                    raise TimeoutError("closing") from None
        if outcome is not None:
            raise outcome
        return simulated.summary()

    def step(outcome: Exception | None) -> tuple[int, dict[str, Any]]:
        version = handle.feed.version
        outcomes.put(outcome)
        deadline = time.monotonic() + 30
        while handle.feed.version == version and time.monotonic() < deadline:
            time.sleep(0.02)
        status, kind, body = get(handle.url + "status.json")
        assert kind == "application/json"
        return status, json.loads(body)

    handle = serve_status(read_summary, 0, interval_s=0.05)
    try:
        status, served = step(NoRunError("the swarm has no run yet"))  # before any good read: only `live`
        assert status == 503 and served == {"live": served["live"]} and served["live"]["error"].endswith("run yet")
        assert get(handle.url + "routing.svg")[0] == 503
        status, served = step(None)
        assert status == 200 and served["run_id"] == simulated.run_id and len(served["nodes"]) == 12
        assert served["live"]["error"] is None and served["live"]["reads"] == 1
        good = served["live"]["version"]
        assert get(handle.url + f"status.json?since={good}")[:2] == (204, "application/json")  # nothing new
        assert get(handle.url + f"status.json?since={good - 1}")[0] == 200
        status, served = step(TimeoutError("DHT get timed out"))
        assert status == 200 and served["live"]["error"] == "DHT get timed out"
        assert served["run_id"] == simulated.run_id and served["live"]["reads"] == 1  # the last good read stays
        status, kind, svg = get(handle.url + "routing.svg")
        assert status == 200 and kind == "image/svg+xml" and svg.count(b'class="node ') >= 12
        assert f'data-version="{good}"'.encode() in svg  # the picture of the last good read
        step(None)
        assert f'data-version="{good}"'.encode() in get(handle.url + f"routing.svg?v={good}")[2]  # still kept
        assert f'data-version="{good + 2}"'.encode() in get(handle.url + "routing.svg?v=abc")[2]
        for path, expected in (("", b"<!doctype html>"), ("app.js", b"/status.json"), ("style.css", b"#graph")):
            status, _, body = get(handle.url + path)
            assert status == 200 and expected in body, path
        assert get(handle.url + "../../etc/passwd")[0] == 404
    finally:
        closing.set()  # the read in progress ends: close waits for it
        assert handle.close(timeout_s=10)
    with pytest.raises(OSError):
        urllib.request.urlopen(handle.url + "status.json", timeout=2)
