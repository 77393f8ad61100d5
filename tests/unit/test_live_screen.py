"""``gwtf join``'s live screen from scripted events: start-up progress (the phase under way, the state
download), then who the node is, its figures, reachability, neighbours and recent events; the event sink on
a terminal; and the output choice (``--json`` and non-terminals keep their lines)."""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import threading
import time

import pytest
from rich.console import Console
from rich.progress_bar import ProgressBar

from gwtf_cli.join_cmd import ProgressLine, event_output
from gwtf_cli.live_screen import LiveScreen, Screen, render, startup_bars

PEER = "12D3KooWAbCdEfGhIjKlMnOpQrStUvWxYz0123456789abc"
NEXT = "12D3KooWNextNextNextNextNextNextNextNextNext99x01"


def text(screen: Screen, now: float) -> str:
    console = Console(width=120, record=True, file=io.StringIO(), force_terminal=False)
    console.print(render(screen, now))
    return console.export_text()


def startup(step: int, next_phase: str, at: float) -> dict:
    return {"event": "startup", "time": at, "phase": "x", "step": step, "steps": 7, "next_phase": next_phase,
            "seconds": at - 1000.0}


def bars(screen: Screen, now: float) -> list[ProgressBar]:
    return [bar for bar, _ in startup_bars(screen, now)]


def test_start_up_shows_the_phase_under_way_with_a_progress_bar() -> None:
    screen = Screen(started_at=1000.0)
    assert "start-up 0/7: joining the DHT" in text(screen, 1001.0)
    screen.apply(startup(4, "model", 1006.0))
    shown = text(screen, 1008.5)
    assert "start-up 4/7: building the model part (2.5 s)" in shown and "joining" in shown
    (bar,) = bars(screen, 1008.5)
    assert (bar.completed, bar.total) == (4, 7)
    screen.apply(startup(6, "join", 1007.0))
    screen.apply({"event": "downloading", "time": 1007.5, "source": PEER, "stage": 1, "iteration": 40})
    shown = text(screen, 1009.0)
    assert "joining the stage's replicas" in shown
    assert "downloading the stage's state of iteration 40 from …789abc (1.5 s)" in shown
    step_bar, download_bar = bars(screen, 1009.0)
    assert (step_bar.completed, download_bar.total) == (6, None)  # a download's size is not known: it pulses


def ready(**extra: object) -> dict:
    return {"event": "ready", "time": 1010.0, "peer_id": PEER, "role": "relay", "stage": 1, "stage_reason":
            "bottleneck", "run_id": "run1", "maddrs": [f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"], "metrics_port": 9400,
            "state_source": "replica", "state_bytes": 3 * 2**20, "download_s": 0.41, "state_iteration": 40,
            "replayed_steps": 2, "from_iteration": 42, **extra}


def progress(iteration: int, **extra: object) -> dict:
    return {"event": "progress", "time": 1012.0, "role": "relay", "stage": 1, "iteration": iteration, "units": 2,
            "peers": 5, "compute_ms": 12.3, "loss": 3.21, "tokens_per_s": 10455.0, "forwards": 120, "backwards": 118,
            "in_flight": 2, "neighbours": [
                {"peer": NEXT, "stage": 2, "units_in": 0, "units_out": 2, "rtt_ms": 2.5, "cost_ms": 15.3}], **extra}


def test_serving_shows_who_the_figures_and_the_neighbours() -> None:
    screen = Screen(started_at=1000.0)
    screen.apply(startup(7, "", 1009.0))
    screen.apply(ready())
    screen.apply(progress(43))
    shown = text(screen, 1080.0)
    assert "relay …789abc · stage 1 (bottleneck) · online · up 1m 20s" in shown
    assert f"--initial-peers /ip4/127.0.0.1/tcp/4001/p2p/{PEER}" in shown.replace("\n", "")
    assert "metrics on port 9400" in shown and "reachability" not in shown
    assert "43" in shown and "3.2100" in shown and "10,455" in shown and "120 / 118" in shown and "12.3 ms" in shown
    assert "downloaded 3.0 MiB from a replica in 0.41 s (iteration 40), 2 step(s) replayed" in shown
    assert "…t99x01" in shown and "15.3" in shown
    assert not bars(screen, 1080.0) and "start-up" not in shown


def test_events_update_iteration_reachability_waiting_and_recent_lines() -> None:
    screen = Screen(started_at=1000.0)
    screen.apply(ready())
    screen.apply(progress(43))
    screen.apply({"event": "step", "time": 1013.0, "stage": 1, "iteration": 43, "hash": "abcd", "count": 4,
                  "seconds": 0.12})
    assert screen.iteration == 44  # steps taken, as the progress events and gwtf status count them
    screen.apply({"event": "reachability", "time": 1014.0, "verdict": "relayed", "announce": [], "asked": 3,
                  "answered": 2, "reached": 0, "relays": ["/ip4/1.2.3.4/tcp/1/p2p/R"], "errors": ["x"]})
    screen.apply({"event": "recovery", "time": 1015.0, "kind": "resend", "microbatch": "d/3/1", "lost": NEXT})
    screen.apply({"event": "waiting", "time": 1016.0, "reason": "no complete route through every stage yet"})
    shown = text(screen, 1017.0)
    assert "reachability: relayed (0 of 2 peers that answered reached it); through /ip4/1.2.3.4/tcp/1/p2p/R" in shown
    screen.apply({"event": "reachability", "time": 1014.2, "verdict": "unknown", "answered": 0, "reached": 0})
    assert "reachability: unknown (no peer answered the check)" in text(screen, 1015.0)
    screen.apply({"event": "reachability", "time": 1014.5, "reachable": True, "relayed": False})  # another shape
    assert "reachability: reachable True, relayed False" in text(screen, 1015.0)
    assert "waiting: no complete route through every stage yet" in shown
    assert "step 43: hash abcd, 4 microbatches, 0.12 s" in shown and "recovery (resend) of d/3/1" in shown
    screen.apply({"event": "iteration", "time": 1018.0, "iteration": 44, "loss": 3.0, "tokens_per_s": 9000.0,
                  "units": 2, "seconds": 0.3})
    screen.apply({"event": "leaving", "time": 1019.0, "iteration": 45})
    shown = text(screen, 1020.0)
    assert "waiting" not in shown and "leaving" in shown and screen.iteration == 45


def test_a_data_holder_without_relay_counters_and_an_unknown_event() -> None:
    screen = Screen(started_at=1000.0)
    screen.apply(ready(role="data", stage=0, state_source="initial", replayed_steps=0))
    screen.apply({"event": "something_new", "time": 1011.0})
    screen.apply({"event": "progress", "time": 1012.0, "role": "data", "stage": 0, "iteration": 0, "units": 0,
                  "peers": 1, "compute_ms": 1.0, "loss": None, "tokens_per_s": 0.0, "neighbours": []})
    shown = text(screen, 1013.0)
    assert "state: initial weights" in shown and "fwd / bwd" not in shown and "no flow neighbours yet" in shown


def test_the_live_sink_draws_on_a_terminal_and_puts_logs_above() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    clock = iter(range(2000, 3000)).__next__
    handler = logging.StreamHandler(sys.__stderr__)
    logging.getLogger().addHandler(handler)
    try:
        with LiveScreen(console, clock=lambda: float(clock())) as live:
            assert handler.stream is sys.stderr and sys.stderr is not sys.__stderr__  # rich's redirect
            live(ready())
            live(progress(7))
        assert handler.stream is sys.__stderr__
    finally:
        logging.getLogger().removeHandler(handler)
    assert "relay …789abc" in out.getvalue() and "10,455" in out.getvalue()


class HeldTerminal(io.StringIO):
    """A terminal whose first write from rich's refresh thread waits until the test lets it go (the thread holds
    the screen's locks meanwhile); every other write goes through."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.go = threading.Event(), threading.Event()

    def write(self, s: str) -> int:
        if threading.current_thread() is not threading.main_thread() and not self.entered.is_set():
            self.entered.set()
            self.go.wait(30)
        return super().write(s)


def test_a_process_forked_while_the_screen_draws_logs_without_it() -> None:
    """The node's DHT is forked while rich's refresh thread may hold the screen's locks; the child has no such
    thread, and its first log line through rich waited for them forever ('the DHT did not start within 60 s')."""
    terminal = HeldTerminal()
    handler = logging.StreamHandler(sys.__stderr__)
    logging.getLogger().addHandler(handler)
    try:
        with LiveScreen(Console(file=terminal, force_terminal=True, width=100)):
            assert terminal.entered.wait(10)  # the refresh thread is inside the screen's locks
            pid = os.fork()
            if pid == 0:  # the child: one log line, then out (it hung here without the fix)
                logging.getLogger("gwtf.test.child").warning("a line from the forked child")
                os._exit(0)
            terminal.go.set()
            exited = wait_for_exit(pid, timeout_s=20)
    finally:
        logging.getLogger().removeHandler(handler)
    assert exited == 0, "the forked child hung on the screen's lock"


def wait_for_exit(pid: int, timeout_s: float) -> int | None:
    """The child's exit status, or None (and it is killed) if it is still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.parametrize("as_json", [True, False])
def test_json_and_non_terminal_output_keep_their_lines(as_json: bool, capsys: pytest.CaptureFixture) -> None:
    with event_output(as_json) as show:  # pytest's captured stdout is not a terminal
        assert isinstance(show, ProgressLine) and show.as_json is as_json
        show({"event": "waiting", "time": 1.0, "reason": "r"})
    printed = capsys.readouterr().out
    assert printed.startswith('{"event": "waiting"') if as_json else printed == "waiting: r\n"
