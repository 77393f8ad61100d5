"""``gwtf join``'s live screen on a terminal: one screen that follows the node, drawn from its events.

``Screen`` is what the events told so far (``apply``; plain data, no terminal). ``render(screen, now)``
draws it with rich: who the node is and the address to join it with, its reachability when the node
reports one, the training figures (iteration, loss, tokens/s, flow units, compute, a relay's work),
the start-up as a progress bar over its phases (the one under way named, e.g. the model build or the
state download, with its time so far), the flow neighbours (RTT, edge cost, units) and the last events.
``LiveScreen`` is the event sink that shows it (rich ``Live``, 4 refreshes a second); ``gwtf join --json``
and output that is not a terminal keep their lines. A process forked while the screen runs (the node's DHT)
leaves it at once: rich's refresh thread may hold the screen's locks at the fork, and a fork has no such
thread to release them, so the child logs to the real stderr and never enters rich.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gwtfp2p.ids import short_peer_id as short

Event = dict[str, Any]
PHASES = {"dht": "joining the DHT", "run spec": "finding the run", "transport": "starting the transport",
          "stage": "choosing a stage", "model": "building the model part", "data": "loading the data shard",
          "join": "joining the stage's replicas"}  # the node's start-up phases, in order (``startup`` events)
RECENT_LINES = 6
NEIGHBOUR_ROWS = 8


def _num(value: Any, digits: int = 1) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:,.{digits}f}"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m {seconds % 60:02d}s"


@dataclass
class Screen:
    """What the node's events told so far."""

    started_at: float
    state: str = "starting"  # starting | joining | online | leaving | stopped
    ready: Event = field(default_factory=dict)
    stage: int | None = None
    stage_reason: str = ""
    phases_done: int = 0
    phases: int = len(PHASES)
    phase: str = "dht"  # the phase under way
    phase_since: float = 0.0
    downloading: Event | None = None
    iteration: int | None = None
    figures: Event = field(default_factory=dict)  # the last progress event
    loss: float | None = None
    tokens_per_s: float | None = None
    recoveries: int = 0
    reachability: Event | None = None
    waiting: str = ""
    recent: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=RECENT_LINES))

    def apply(self, event: Event) -> None:
        name, now = event.get("event"), float(event.get("time", self.started_at))
        handler = getattr(self, f"_on_{name}", None)
        if handler is not None:
            handler(event, now)

    def _note(self, now: float, line: str) -> None:
        self.recent.append((now, line))

    def _on_startup(self, e: Event, now: float) -> None:
        self.state = "joining" if self.state == "starting" else self.state
        self.phases_done, self.phases = int(e.get("step", 0)), int(e.get("steps", self.phases))
        self.phase, self.phase_since = str(e.get("next_phase", "")), now

    def _on_placed(self, e: Event, now: float) -> None:
        self.stage, self.stage_reason = e.get("stage"), str(e.get("reason", ""))
        self._note(now, f"placed on stage {self.stage} ({self.stage_reason})")

    def _on_downloading(self, e: Event, now: float) -> None:
        self.downloading = {**e, "since": now}

    def _on_replayed(self, e: Event, now: float) -> None:
        self._note(now, f"replayed {e.get('steps')} step(s) from {short(str(e.get('source', '')))}")

    def _on_ready(self, e: Event, now: float) -> None:
        self.ready, self.state, self.downloading = e, "online", None
        self.stage, self.stage_reason = e.get("stage"), str(e.get("stage_reason", ""))
        self.iteration = e.get("from_iteration")
        self._note(now, f"ready after {now - self.started_at:.1f} s")

    def _on_progress(self, e: Event, now: float) -> None:
        self.figures, self.iteration = e, e.get("iteration", self.iteration)
        self.loss = e.get("loss") if e.get("loss") is not None else self.loss
        self.tokens_per_s = e.get("tokens_per_s") or self.tokens_per_s

    def _on_iteration(self, e: Event, now: float) -> None:
        self.iteration, self.loss, self.tokens_per_s = int(e["iteration"]) + 1, e.get("loss"), e.get("tokens_per_s")
        self.waiting = ""
        self._note(now, f"iteration {e['iteration']}: loss {_num(e.get('loss'), 4)}, "
                        f"{e.get('units')} unit(s), {_num(e.get('seconds'), 2)} s")

    def _on_step(self, e: Event, now: float) -> None:
        self.iteration, self.waiting = int(e["iteration"]) + 1, ""
        self._note(now, f"step {e['iteration']}: hash {e.get('hash')}, {e.get('count')} microbatches, "
                        f"{_num(e.get('seconds'), 2)} s")

    def _on_waiting(self, e: Event, now: float) -> None:
        self.waiting = str(e.get("reason", ""))

    def _on_recovery(self, e: Event, now: float) -> None:
        self.recoveries += 1
        self._note(now, f"recovery ({e.get('kind')}) of {e.get('microbatch')}: {short(str(e.get('lost', '')))} lost")

    def _on_reachability(self, e: Event, now: float) -> None:
        self.reachability = {k: v for k, v in e.items() if k not in ("event", "time")}

    def _on_first_microbatch(self, e: Event, now: float) -> None:
        self._note(now, f"first microbatch at iteration {e.get('iteration')}")

    def _on_checkpoint(self, e: Event, now: float) -> None:
        self._note(now, f"checkpoint of iteration {e.get('iteration')} ({_num(e.get('seconds'), 2)} s)")

    def _on_training_done(self, e: Event, now: float) -> None:
        self._note(now, f"training done at iteration {e.get('iteration')}")

    def _on_leaving(self, e: Event, now: float) -> None:
        self.state = "leaving"
        self._note(now, f"leaving at iteration {e.get('iteration')}")

    def _on_stopped(self, e: Event, now: float) -> None:
        self.state = "stopped"
        self._note(now, "stopped")


def _header(s: Screen, now: float) -> RenderableType:
    r = s.ready
    who = f"{r.get('role', 'node')} {short(str(r.get('peer_id', '')))}" if r else "node"
    stage = "" if s.stage is None else f" · stage {s.stage}" + (f" ({s.stage_reason})" if s.stage_reason else "")
    colour = {"online": "green", "leaving": "yellow", "stopped": "red"}.get(s.state, "cyan")
    lines = [Text.assemble((who, "bold"), stage, " · ", (s.state, colour), f" · up {_duration(now - s.started_at)}")]
    if r:
        maddr = (r.get("maddrs") or ["?"])[0]
        lines.append(Text(f"run {r.get('run_id')} · join with --initial-peers {maddr}", overflow="fold"))
        if r.get("metrics_port") is not None:
            lines.append(Text(f"metrics on port {r['metrics_port']} (/metrics)"))
    if s.reachability is not None:
        lines.append(_reachability(s.reachability))
    return Group(*lines)


def _reachability(r: Event) -> Text:
    """The ``reachability`` event: its verdict, how many peers that answered reached the node, the address
    announced or the relays; any other shape shown field by field."""
    verdict = r.get("verdict")
    if not isinstance(verdict, str):
        return Text("reachability: " + ", ".join(f"{k} {v}" for k, v in r.items()
                                                 if isinstance(v, (str, int, float, bool))))
    line = Text.assemble("reachability: ", (verdict, {"direct": "green", "relayed": "yellow"}.get(verdict, "dim")))
    if r.get("answered") == 0:
        line.append(" (no peer answered the check)")
    elif isinstance(r.get("answered"), int) and isinstance(r.get("reached"), int):
        line.append(f" ({r['reached']} of {r['answered']} peers that answered reached it)")
    for key, label in (("announce", "announced"), ("relays", "through")):
        if r.get(key):
            line.append(f"; {label} {', '.join(map(str, r[key]))}")
    return line


def _training(s: Screen) -> RenderableType:
    f = s.figures
    grid = Table.grid(padding=(0, 3))
    cells = [("iteration", "-" if s.iteration is None else str(s.iteration)), ("loss", _num(s.loss, 4)),
             ("tokens/s", _num(s.tokens_per_s, 0)), ("flow units", str(f.get("units", "-"))),
             ("compute", f"{_num(f.get('compute_ms'))} ms"), ("recoveries", str(s.recoveries))]
    if "forwards" in f:
        cells += [("fwd / bwd", f"{f['forwards']} / {f['backwards']}"), ("in flight", str(f.get("in_flight")))]
    for _ in cells:
        grid.add_column()
    grid.add_row(*(Text(label, style="dim") for label, _ in cells))
    grid.add_row(*(Text(value, style="bold") for _, value in cells))
    return grid


def startup_bars(s: Screen, now: float) -> list[tuple[ProgressBar, str]]:
    """While the node starts: the start-up's bar over its phases, and a pulsing one while it downloads its
    state (the size is not known before it arrives); none once it serves."""
    if s.state not in ("starting", "joining"):
        return []
    since = now - (s.phase_since or s.started_at)
    bars = [(ProgressBar(total=s.phases, completed=s.phases_done, width=30, animation_time=now),
             f"start-up {s.phases_done}/{s.phases}: {PHASES.get(s.phase, s.phase)} ({since:.1f} s)")]
    if s.downloading is not None:
        d = s.downloading
        bars.append((ProgressBar(total=None, width=30, pulse=True, animation_time=now),
                     f"downloading the stage's state of iteration {d.get('iteration')} from "
                     f"{short(str(d.get('source', '')))} ({now - d['since']:.1f} s)"))
    return bars


def _startup(s: Screen, now: float) -> RenderableType:
    bars = startup_bars(s, now)
    if bars:
        return Group(*(_bar_row(bar, Text(" " + label)) for bar, label in bars))
    r = s.ready
    if not r:
        return Text("")
    source = r.get("state_source", "initial")
    if source == "replica":
        state = (f"downloaded {r.get('state_bytes', 0) / 2**20:.1f} MiB from a replica in "
                 f"{_num(r.get('download_s'), 2)} s (iteration {r.get('state_iteration')})")
    else:
        state = {"checkpoint": "restored from the local checkpoint"}.get(source, "initial weights")
    replayed = f", {r['replayed_steps']} step(s) replayed" if r.get("replayed_steps") else ""
    return Text(f"state: {state}{replayed}", style="dim")


def _bar_row(bar: ProgressBar, label: Text) -> Table:
    row = Table.grid()
    row.add_column(width=30)
    row.add_column()
    row.add_row(bar, label)
    return row


def _neighbours(s: Screen) -> RenderableType:
    rows = s.figures.get("neighbours") or []
    if not rows:
        return Text("no flow neighbours yet", style="dim")
    table = Table("neighbour", "stage", "RTT ms", "cost ms", "units in", "units out", box=None, padding=(0, 2),
                  header_style="dim")
    for n in rows[:NEIGHBOUR_ROWS]:
        table.add_row(short(str(n.get("peer", ""))), str(n.get("stage")), _num(n.get("rtt_ms")),
                      _num(n.get("cost_ms")), str(n.get("units_in")), str(n.get("units_out")))
    more = len(rows) - NEIGHBOUR_ROWS
    return Group(table, Text(f"... and {more} more", style="dim")) if more > 0 else table


def render(s: Screen, now: float) -> RenderableType:
    """The whole screen at wall time ``now``."""
    parts: list[RenderableType] = [_header(s, now), Text(""), _training(s), _startup(s, now)]
    if s.waiting:
        parts.append(Text(f"waiting: {s.waiting}", style="yellow"))
    parts += [Text(""), _neighbours(s), Text("")]
    parts += [Text(f"{time.strftime('%H:%M:%S', time.localtime(t))}  {line}", style="dim") for t, line in s.recent]
    return Group(*parts)


_RUNNING: set[LiveScreen] = set()  # the screens started in this process (a forked child leaves them)


def _leave_screens_in_child() -> None:
    """After a fork: this process (the DHT's) does not draw; its logs go straight to the terminal."""
    for screen in list(_RUNNING):
        screen.detach()
    _RUNNING.clear()


os.register_at_fork(after_in_child=_leave_screens_in_child)


class LiveScreen:
    """The event sink that draws ``Screen`` on the terminal while the node runs (``with`` starts and stops it).
    Log lines written while it runs appear above it."""

    def __init__(self, console: Console | None = None, clock: Any = time.time) -> None:
        self.screen = Screen(started_at=clock())
        self._clock = clock
        self._lock = threading.Lock()  # events come from the node's loop; the refresh runs in rich's thread
        self._live = Live(console=console, get_renderable=self._draw, refresh_per_second=4)
        self._streams: list[tuple[logging.StreamHandler, Any]] = []
        self._std: tuple[Any, Any] = (sys.stdout, sys.stderr)

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.screen.apply(event)

    def _draw(self) -> RenderableType:
        with self._lock:
            return render(self.screen, self._clock())

    def __enter__(self) -> LiveScreen:
        self._std = (sys.stdout, sys.stderr)
        self._live.start()  # rich's proxies take sys.stdout and sys.stderr: lines print above the screen
        for handler in logging.getLogger().handlers:  # logging to the real stderr would tear the screen
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.__stderr__:
                self._streams.append((handler, handler.setStream(sys.stderr)))
        _RUNNING.add(self)
        return self

    def __exit__(self, *_exc: object) -> None:
        _RUNNING.discard(self)
        for handler, stream in self._streams:
            handler.setStream(stream)
        self._live.stop()

    def detach(self) -> None:
        """In a forked child: stop using rich without a lock (the parent's refresh thread may have held its
        locks at the fork, and nothing in the child releases them): the streams back as they were, unflushed."""
        for handler, stream in self._streams:
            handler.stream = stream  # not ``setStream``: it would flush rich's proxy
        sys.stdout, sys.stderr = self._std
        self._streams = []
