"""What the swarm did between status reads: loss and tokens/s over time, and recent events.

The DHT keeps no history, so events are derived by comparing successive reads: a node appearing
(join), turning online or leaving, its record vanishing without a ``leaving`` state (a crash: it
stopped renewing its record, which then expired), a stage losing its last replica or regaining one
(recovery), replicas diverging or coming back in sync. Crashed nodes are kept a while as ``gone``
so the picture can mark them. Pure: the caller passes each read's time; no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from gwtfp2p.ids import short_peer_id as short

MAX_POINTS = 720  # points of the loss / tokens-per-second series kept (one per iteration seen)
MAX_EVENTS = 100
GONE_KEEP_S = 120.0  # how long a crashed node stays in the picture


@dataclass(frozen=True, slots=True)
class Event:
    at_s: float
    kind: str  # run | join | online | leaving | left | crash | recovery | unserved | diverged | in_sync
    text: str
    peer_id: str | None = None
    stage: int | None = None


def _name(node: dict[str, Any]) -> str:
    role = "data holder" if node["role"] == "data" else f"relay (stage {node['stage']})"
    return f"{role} {short(node['peer_id'])}"


class History:
    """Successive reads of one swarm: ``observe`` each summary, ``fail`` each failed read, ``view``."""

    def __init__(self, *, max_points: int = MAX_POINTS, max_events: int = MAX_EVENTS,
                 gone_keep_s: float = GONE_KEEP_S) -> None:
        self.series: deque[dict[str, Any]] = deque(maxlen=max_points)
        self.events: deque[Event] = deque(maxlen=max_events)
        self.gone: dict[str, dict[str, Any]] = {}
        self.gone_keep_s = gone_keep_s
        self.version = 0
        self.reads = 0
        self.read_at_s: float | None = None
        self.error: str | None = None
        self.error_at_s: float | None = None
        self._run_id: str | None = None
        self._nodes: dict[str, dict[str, Any]] = {}
        self._stages: dict[int, dict[str, Any]] = {}

    def observe(self, summary: dict[str, Any], now_s: float) -> None:
        """One successful read of the swarm at ``now_s``."""
        if summary["run_id"] != self._run_id:
            self._new_run(summary, now_s)
        else:
            self._compare_nodes(summary, now_s)
            self._compare_stages(summary, now_s)
        self._nodes = {n["peer_id"]: n for n in summary["nodes"]}
        self._stages = {s["stage"]: s for s in summary["stages"]}
        self.gone = {p: g for p, g in self.gone.items() if now_s - g["at_s"] <= self.gone_keep_s}
        if not self.series or self.series[-1]["iteration"] != summary["iteration"]:
            self.series.append({"at_s": now_s, "iteration": summary["iteration"], "loss": summary["loss"],
                                "tokens_per_s": summary["tokens_per_s"]})
        self.reads += 1
        self.read_at_s, self.error, self.error_at_s = now_s, None, None
        self.version += 1

    def fail(self, error: str, now_s: float) -> None:
        """A read that failed (the last good one stays shown, with its age)."""
        self.error, self.error_at_s = error, now_s
        self.version += 1

    def view(self) -> dict[str, Any]:
        return {"version": self.version, "reads": self.reads, "read_at_s": self.read_at_s, "error": self.error,
                "error_at_s": self.error_at_s, "series": list(self.series),
                "events": [asdict(e) for e in reversed(self.events)],
                "gone": sorted(self.gone.values(), key=lambda g: g["peer_id"])}

    def _emit(self, now_s: float, kind: str, text: str, peer_id: str | None = None, stage: int | None = None) -> None:
        self.events.append(Event(now_s, kind, text, peer_id, stage))

    def _new_run(self, summary: dict[str, Any], now_s: float) -> None:
        first = self._run_id is None
        self._run_id = summary["run_id"]
        self.series.clear()
        self.gone.clear()
        self._nodes, self._stages = {}, {}
        verb = "watching" if first else "a new run:"
        self._emit(now_s, "run", f"{verb} run {summary['run_id']} at iteration {summary['iteration']}, "
                                 f"{len(summary['nodes'])} node(s)")

    def _compare_nodes(self, summary: dict[str, Any], now_s: float) -> None:
        now = {n["peer_id"]: n for n in summary["nodes"]}
        for peer, node in now.items():
            before = self._nodes.get(peer)
            if before is None:
                self._joined(node, now_s)
            elif before["state"] != node["state"] and node["state"] in ("online", "leaving"):
                verb = "is online" if node["state"] == "online" else "is leaving"
                self._emit(now_s, node["state"], f"{_name(node)} {verb}", peer, node["stage"])
        for peer, node in self._nodes.items():
            if peer in now:
                continue
            if node["state"] == "leaving":
                self._emit(now_s, "left", f"{_name(node)} left", peer, node["stage"])
                continue
            self._emit(now_s, "crash", f"{_name(node)} crashed: its record expired without a goodbye "
                                       f"(last at iteration {node['iteration']})", peer, node["stage"])
            self.gone[peer] = {"peer_id": peer, "role": node["role"], "stage": node["stage"],
                               "location": node.get("location", ""), "iteration": node["iteration"],
                               "at_s": now_s}

    def _joined(self, node: dict[str, Any], now_s: float) -> None:
        peer, stage = node["peer_id"], node["stage"]
        self.gone.pop(peer, None)
        self._emit(now_s, "join", f"{_name(node)} joined ({node['state']})", peer, stage)
        crashed = [g for g in self.gone.values() if g["stage"] == stage]
        if crashed:
            names = ", ".join(short(g["peer_id"]) for g in crashed)
            self._emit(now_s, "recovery", f"stage {stage} regains a replica ({short(peer)}) after the crash of "
                                          f"{names}", peer, stage)

    def _compare_stages(self, summary: dict[str, Any], now_s: float) -> None:
        for stage in summary["stages"]:
            k, before = stage["stage"], self._stages.get(stage["stage"])
            if before is None:
                continue
            if k > 0 and before["replicas"] and not stage["replicas"]:
                self._emit(now_s, "unserved", f"stage {k} has no replica left: the swarm waits", stage=k)
            elif k > 0 and not before["replicas"] and stage["replicas"]:
                names = ", ".join(short(p) for p in stage["replicas"])
                self._emit(now_s, "recovery", f"stage {k} is served again by {names}", stage=k)
            was, now = before["sync"]["state"], stage["sync"]["state"]
            if was != now and now == "diverged":
                lines = [line for line in summary.get("sync_problems", []) if line.startswith(f"stage {k}: ")]
                self._emit(now_s, "diverged", "; ".join(lines) or f"stage {k}: replicas diverged", stage=k)
            elif was == "diverged" and now == "in_sync":
                self._emit(now_s, "in_sync", f"stage {k}: replicas in sync again", stage=k)
