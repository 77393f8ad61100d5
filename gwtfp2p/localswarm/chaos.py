"""Seeded relay crashes in a local swarm while it trains (``gwtf demo --churn``, ``bench_chaos.py``).

A ``ChaosDriver`` thread follows a data holder's iterations. At ``rate`` crashes per iteration it
picks a moment inside the iteration and a live relay, and either SIGKILLs the relay's whole
process group (daemon, DHT process, p2pd: a real crash, at a random wall-clock moment) or arms a
crash point in it (mid-forward, mid-backward, mid-aggregation, or with its iteration's work done and its
contribution unsent: ``$GWTF_CRASH_FILE`` + SIGUSR1,
``gwtfp2p.daemon.testing.testpoints``). Every crash starts a replacement relay (``--stage auto``). The last
live replica of a stage that has stepped is never a victim (unless ``kill_last``): such a crash waits for a
replacement to step.
"""

from __future__ import annotations

import logging
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gwtfp2p.localswarm.chaos_figures import run_figures
from gwtfp2p.localswarm.processes import Daemon

logger = logging.getLogger(__name__)
CRASH_FILE_ENV = "GWTF_CRASH_FILE"  # daemon.testing.testpoints.CRASH_FILE_ENV (not imported: fast CLI start)
MODES = ("random", "forward", "backward", "aggregation", "contribution")
MODE_WEIGHTS = (0.4, 0.15, 0.15, 0.15, 0.15)
POINTS = {"forward": "exit_after_forward", "backward": "exit_before_backward", "aggregation": "exit_mid_aggregation",
          "contribution": "exit_before_aggregation"}  # the last: its contribution dies with it (survivors redo it)
POLL_S = 0.05
FIRST_ITERATION_S = 1.0  # the typical iteration before one was measured
ARMED_MIN_S = 6.0  # an armed point not reached within max(this, 4 iterations): SIGKILL then
MAX_JOIN_FAILURES = 5
CHAOS_FIELDS = ("crashes", "joins", "lost_microbatches", "recomputed_hops", "replicas_in_sync")


def _units(daemon: Daemon) -> int:
    """Flow units through a relay, as its latest ``progress`` event says (0 before the first)."""
    progress = daemon.of("progress")
    return progress[-1].get("units", 0) if progress else 0


def crash_env(crash_dir: Path, name: str) -> dict[str, str]:
    """Environment for a relay the driver may crash at a point: its crash file (read on SIGUSR1)."""
    return {CRASH_FILE_ENV: str(crash_dir / f"{name}.crash")}


@dataclass
class Crash:
    """One crash: planned at ``planned_at`` for the iteration ``planned_iteration``, executed at ``at``."""

    index: int
    mode: str  # random | forward | backward | aggregation | contribution
    planned_iteration: int
    planned_at: float
    victim: str = ""
    peer_id: str = ""
    stage: int = 0
    iteration: int = -1  # the data holder's iteration in progress when the victim died
    at: float = 0.0  # wall time of the kill, or of the victim's own ``fault`` event
    how: str = ""  # killed | crash point | killed (point not reached)
    replacement: str = ""
    deferred_s: float = 0.0  # waited for an eligible victim

    def as_dict(self) -> dict:
        return asdict(self)


class ChaosDriver:
    """Crashes relays of a running swarm at ``rate`` per iteration of ``holder`` (see module docstring)."""

    def __init__(self, holder: Daemon, relays: Callable[[], list[Daemon]], spawn_replacement: Callable[[str], Daemon],
                 rate: float, seed: int, crash_dir: Path, iterations: int, kill_last: bool = False,
                 modes: tuple[str, ...] = ()) -> None:
        self.holder = holder
        self.relays = relays
        self.spawn_replacement = spawn_replacement
        self.rate = rate
        self.rng = random.Random(seed)
        self.crash_dir = crash_dir
        self.iterations = iterations
        self.kill_last = kill_last
        self.modes = modes  # a fixed cycle of crash kinds (tests); empty: drawn with MODE_WEIGHTS
        self.crashes: list[Crash] = []
        self.pending: list[Crash] = []
        self.armed: dict[str, tuple[Crash, Daemon, float]] = {}  # victim name -> (crash, victim, deadline)
        self.doomed: set[str] = set()
        self.replacements: list[Daemon] = []
        self.failed_joins: list[str] = []  # replacements that exited before they were ready
        self.planned = 0
        self.started_iterations = 0
        self.ends: list[float] = []  # wall times of the holder's iteration events
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos", daemon=True)
        self.error: BaseException | None = None
        self.say: Callable[[str], None] = lambda _line: None  # progress lines (``gwtf demo``)
        self._announced: set[str] = set()

    def start(self) -> ChaosDriver:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more crashes; armed victims that have not crashed yet are killed now (they are doomed)."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._settle_armed()  # those that did crash at their point meanwhile
        for crash, victim, _ in list(self.armed.values()):
            self._kill(crash, victim, "killed (point not reached)")
        self.armed.clear()

    @property
    def joins(self) -> int:
        return sum(1 for d in self.replacements if d.of("ready"))

    # -- the loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._follow()
                self._settle_armed()
                self._fire_due()
                self._watch_replacements()
                self._stop.wait(POLL_S)
        except BaseException as e:  # reported by the caller (a harness bug must not pass silently)
            logger.exception("chaos driver failed")
            self.error = e

    def _recent_gaps_s(self) -> list[float]:
        """The holder's last five iterations, in seconds."""
        return [b - a for a, b in zip(self.ends, self.ends[1:], strict=False)][-5:]

    def _typical_s(self) -> float:
        gaps = self._recent_gaps_s()
        return statistics.median(gaps) if gaps else FIRST_ITERATION_S

    def _shortest_s(self) -> float:
        """The shortest of the last five iterations: a moment drawn within it falls inside the coming
        iteration (or the next), never after the end of training (the last crash is planned two
        iterations before it)."""
        gaps = self._recent_gaps_s()
        return min(gaps) if gaps else FIRST_ITERATION_S

    def _follow(self) -> None:
        """Crashes are planned as the holder starts iterations: by the start of iteration t,
        ``floor(rate × (t + 2))`` of them, ``floor(rate × iterations)`` in all (none in the last
        iteration, so that each one happens while the swarm trains), each at a uniformly random
        moment within the shortest recent iteration from then."""
        self.ends = [e["time"] for e in self.holder.of("iteration")]
        started = len(self.ends) + (1 if self.holder.of("first_microbatch") else 0)
        done = bool(self.holder.of("training_done"))
        total = int(self.rate * self.iterations + 1e-9)
        while self.started_iterations < min(started, self.iterations) and not done:
            t = self.started_iterations
            self.started_iterations += 1
            while self.planned < min(total, int(self.rate * (t + 2) + 1e-9)):
                self.planned += 1
                mode = self.rng.choices(MODES, MODE_WEIGHTS)[0]
                if self.modes:
                    mode = self.modes[(self.planned - 1) % len(self.modes)]
                at = time.time() + self.rng.uniform(0.0, self._shortest_s())
                self.pending.append(Crash(self.planned - 1, mode, t, at))

    def _eligible(self) -> list[Daemon]:
        """Live relays that may crash now: each needs another live replica of its stage that has stepped (a
        replacement that is ready but has not stepped yet may not be a member of the iteration under way:
        with no member left, the stage's work of that iteration dies with the victim)."""
        live = [d for d in self.relays() if d.of("ready") and d.popen.poll() is None and d.name not in self.doomed]
        stepped: dict[int, set[str]] = {}
        for daemon in live:
            if daemon.of("step"):
                stepped.setdefault(daemon.of("ready")[0]["stage"], set()).add(daemon.name)
        return [d for d in live if self.kill_last or stepped.get(d.of("ready")[0]["stage"], set()) - {d.name}]

    def _fire_due(self) -> None:
        now = time.time()
        while self.pending and self.pending[0].planned_at <= now:
            victims = self._eligible()
            if not victims:
                return  # deferred: retried every poll until a replacement is ready
            crash = self.pending.pop(0)
            if crash.mode != "random":  # a crash point is only reached by a relay that carries flow
                victims = [d for d in victims if _units(d) > 0] or victims
            self._execute(crash, self.rng.choice(sorted(victims, key=lambda d: d.name)))

    def _execute(self, crash: Crash, victim: Daemon) -> None:
        ready = victim.of("ready")[0]
        crash.victim, crash.peer_id, crash.stage = victim.name, ready["peer_id"], ready["stage"]
        crash.deferred_s = max(0.0, time.time() - crash.planned_at)
        self.doomed.add(victim.name)
        self.crashes.append(crash)
        crash.replacement = self._replace()  # started first: the swarm never has fewer processes than planned
        if crash.mode == "random":
            self._kill(crash, victim, "killed")
        else:
            iteration = len(self.holder.of("iteration"))
            (self.crash_dir / f"{victim.name}.crash").write_text(f"{POINTS[crash.mode]}:{crash.stage}:{iteration}")
            victim.signal_group(signal.SIGUSR1, group=False)
            deadline = time.time() + max(ARMED_MIN_S, 4 * self._typical_s())
            self.armed[victim.name] = (crash, victim, deadline)

    def _kill(self, crash: Crash, victim: Daemon, how: str) -> None:
        victim.signal_group(signal.SIGKILL)  # daemon, DHT process and p2pd: a crash
        self._died(crash, time.time(), how)

    def _died(self, crash: Crash, at: float, how: str) -> None:
        crash.at, crash.how = at, how
        crash.iteration = sum(1 for e in self.holder.of("iteration") if e["time"] <= at)
        places = {"crash point": f"at its {POINTS.get(crash.mode)} point", "killed": "SIGKILL at a random moment"}
        where = places.get(how, how)
        self.say(f"  crash {crash.index + 1}: {crash.victim} (stage {crash.stage}) died in iteration "
                 f"{crash.iteration} ({where}); {crash.replacement or 'a replacement'} is starting")

    def _settle_armed(self) -> None:
        """Armed victims that reached their point (or exited) are recorded; one that has not reached it
        within its deadline, or by the start of the holder's last iteration, is SIGKILLed then (so that
        every executed crash happens while the swarm trains)."""
        now = time.time()
        last_started = len(self.holder.of("iteration")) >= self.iterations - 1
        for name, (crash, victim, deadline) in list(self.armed.items()):
            faults = victim.of("fault")
            if faults:
                self._died(crash, faults[0]["time"], "crash point")
            elif victim.popen.poll() is not None:
                self._died(crash, now, "exited")
            elif now >= deadline or last_started:
                self._kill(crash, victim, "killed (point not reached)")
            else:
                continue
            del self.armed[name]

    def _replace(self) -> str:
        name = f"join{len(self.replacements) + len(self.failed_joins)}"
        self.replacements.append(self.spawn_replacement(name))
        return name

    def _watch_replacements(self) -> None:
        """A replacement that exited before it was ready (e.g. it lost its state source) is replaced."""
        for daemon in list(self.replacements):
            ready = daemon.of("ready")
            if ready and daemon.name not in self._announced:
                self._announced.add(daemon.name)
                self.say(f"  join: {daemon.name} serves stage {ready[0]['stage']} from iteration "
                         f"{ready[0]['from_iteration']} ({ready[0]['state_source']} state, "
                         f"{ready[0]['time'] - daemon.started_at:.0f} s after its start)")
            if not ready and daemon.popen.poll() is not None:
                self.replacements.remove(daemon)
                self.failed_joins.append(daemon.name)
                logger.warning("replacement %s exited before joining: %s", daemon.name, daemon.stderr_tail(3))
                if len(self.failed_joins) <= MAX_JOIN_FAILURES:
                    self._replace()

    def summary(self) -> dict:
        unexecuted = len(self.pending)
        return {"crashes": len(self.crashes), "joins": self.joins, "join_failures": len(self.failed_joins),
                "crashes_not_executed": unexecuted,
                "deferred_crashes": sum(1 for c in self.crashes if c.deferred_s > 0.5),
                "by_mode": {m: sum(1 for c in self.crashes if c.mode == m) for m in MODES}}


def chaos_summary(driver: ChaosDriver, holders: list[Daemon], daemons: list[Daemon], n_stages: int,
                  microbatches: int, iterations: int) -> dict:
    """The driver's counts, the run's checks and per-crash figures (``chaos_figures``) in one dict."""
    crashes = [c.as_dict() for c in driver.crashes]
    figures = run_figures(crashes, holders, daemons, n_stages, microbatches, iterations)
    return {"rate": driver.rate, **driver.summary(), **figures}


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def describe_chaos(c: dict) -> list[str]:
    """Lines for people (``gwtf demo --churn``)."""
    modes = ", ".join(f"{n} {m}" for m, n in c["by_mode"].items() if n)
    sync = "yes" if c["replicas_in_sync"] else "NO"
    lines = [f"churn: {c['crashes']} crashes ({modes or 'none'}), {c['joins']} replacements joined; lost microbatches "
             f"of live data holders: {c['lost_microbatches']}; replicas in sync: {sync}",
             f"  recomputed hops: {c['recomputed_hops']} ({_f(c['recomputed_hops_per_crash'])} per crash, "
             f"{_f(c['recomputed_hops_per_affected_microbatch'])} per affected microbatch); extra time per crash: "
             f"mean {_f(c['extra_s_per_crash_mean'])} s, p95 {_f(c['extra_s_per_crash_p95'])} s "
             f"(crash-free iteration: {_f(c['clean_iteration_s'])} s)"]
    if c["crashes_not_executed"]:
        lines.append(f"  {c['crashes_not_executed']} planned crash(es) not executed: no stage had a spare replica in "
                     "time (a replacement takes seconds to start; try --relays-per-stage 3, or --geo for longer "
                     "iterations)")
    lines += [f"  PROBLEM: {v}" for v in c["violations"]]
    return lines
