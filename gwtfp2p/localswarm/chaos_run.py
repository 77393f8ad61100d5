"""One seeded chaos run of a local swarm, with a hard time limit (``bench_chaos.py``, the chaos test).

Starts the data holders and relays (explicit stages, all at once, training from ``--min-nodes``),
runs the ``ChaosDriver`` while the data holders train a fixed number of iterations, then stops
everything and returns the run's checks and figures (``chaos_figures.run_figures``). A run still
going at its time limit is stopped and reported as failed; it never hangs.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gwtfp2p.localswarm.chaos import ChaosDriver, crash_env
from gwtfp2p.localswarm.chaos_figures import run_figures
from gwtfp2p.localswarm.processes import FAST, Daemon, Swarm

GEO_HOLDERS = ("Frankfurt", "London")
STEP_WAIT_S = 30.0  # after the holders' last iteration, for the relays' last step
GEO_RELAYS = ("Tokyo", "Seoul", "Singapore", "Sydney", "Oregon")  # volunteers far from the data: seconds per iteration


@dataclass(frozen=True)
class ChaosSetup:
    iterations: int = 30
    rate: float = 0.34  # crashes per iteration
    seed: int = 0
    stages: int = 2
    relays_per_stage: int = 3
    data_holders: int = 2
    microbatches_per_dh: int = 4
    microbatch_size: int = 2
    seq_len: int = 16
    lr: float = 3e-3
    capacity: int = 0  # microbatches per relay; 0: all of the swarm's (one live replica carries a whole stage)
    link_scale: float = 0.0  # > 0: geo10 link emulation at this scale (holders in Europe, relays worldwide)
    limit_s: float = 300.0
    kill_last: bool = False
    modes: tuple[str, ...] = ()  # a fixed cycle of crash kinds (chaos.MODES); empty: drawn at random

    @property
    def processes(self) -> int:
        return self.data_holders + self.stages * self.relays_per_stage

    @property
    def relay_capacity(self) -> int:
        return self.capacity or self.microbatches_per_dh * self.data_holders


def _spec_file(setup: ChaosSetup, work: Path) -> str:
    spec = {"model_family": "gpt2", "model_preset": "tiny", "n_stages": setup.stages, "seed": setup.seed,
            "lr": setup.lr, "microbatch_size": setup.microbatch_size, "seq_len": setup.seq_len,
            "microbatches_per_dh": setup.microbatches_per_dh}
    path = work / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


class ChaosRun:
    """The swarm and driver of one run; ``run`` returns its result dict."""

    def __init__(self, setup: ChaosSetup, work: Path) -> None:
        self.setup = setup
        self.work = work
        self.swarm = Swarm(work, common=(*FAST, "--log-level", "INFO"))
        self.holders: list[Daemon] = []
        self.rng = random.Random(f"chaos-locations:{setup.seed}")
        self.deadline = 0.0
        self.unplanned: list[Daemon] = []

    def _where(self, location: str) -> tuple[str, ...]:
        scale = self.setup.link_scale
        return ("--location", location, "--link-scale", str(scale)) if scale > 0 else ()

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"time limit of {self.setup.limit_s:.0f} s reached")
        return left

    def _relay(self, name: str, stage: str) -> Daemon:
        location = self.rng.choice(GEO_RELAYS)
        return self.swarm.spawn_relay(name, stage, "--capacity", str(self.setup.relay_capacity), *self._where(location),
                                      env=crash_env(self.work, name))

    def _start(self) -> None:
        s = self.setup
        dh = self.swarm.start("dh0", "--role", "data", "--run-spec", _spec_file(s, self.work), "--shard",
                              f"0/{s.data_holders}", "--max-iterations", str(s.iterations), "--min-nodes",
                              str(s.processes), *self._where(GEO_HOLDERS[0]), wait_ready_s=self._remaining())
        self.holders = [dh]
        for i in range(1, s.data_holders):
            self.holders.append(self.swarm.spawn(f"dh{i}", "--role", "data", *self.swarm.bootstrap_args(),
                                                 "--shard", f"{i}/{s.data_holders}", "--max-iterations",
                                                 str(s.iterations), *self._where(GEO_HOLDERS[i % 2])))
        for k in range(1, s.stages + 1):
            for i in range(s.relays_per_stage):
                self._relay(f"r{k}{i}", str(k))

    def run(self) -> dict[str, Any]:
        s = self.setup
        started = time.time()
        self.deadline = time.monotonic() + s.limit_s
        driver: ChaosDriver | None = None
        error, ended = "", 0.0
        try:
            self._start()
            driver = ChaosDriver(self.holders[0], lambda: [d for d in self.swarm.daemons if d not in self.holders],
                                 lambda name: self._relay(name, "auto"), s.rate, s.seed, self.work, s.iterations,
                                 s.kill_last, s.modes).start()
            for holder in self.holders:
                holder.wait_event("training_done", self._remaining())
            driver.stop()
            ended = time.time()
            self._wait_last_steps(driver)
            self.unplanned = self._unplanned_deaths(driver)
        except (TimeoutError, RuntimeError) as e:
            error = str(e)
        finally:
            if driver is not None:
                driver.stop()
            ended = ended or time.time()
            self.swarm.close(grace_s=1.0)
        if driver is not None and driver.error is not None:
            error = error or f"chaos driver: {driver.error!r}"
        self._save_events()
        return self._result(driver, error, started, ended)

    def _unplanned_deaths(self, driver: ChaosDriver) -> list[Daemon]:
        """Daemons that exited though no crash was planned for them (a replacement that failed to join
        is counted by the driver instead)."""
        return [d for d in self.swarm.daemons if d.popen.poll() is not None and d.name not in driver.doomed
                and d.name not in driver.failed_joins]

    def _wait_last_steps(self, driver: ChaosDriver) -> None:
        """Every live relay that is a member of the last iteration steps it (after the holders' end)."""
        last = self.setup.iterations - 1
        for relay in self.swarm.daemons:
            ready = relay.of("ready")
            if relay in self.holders or relay.name in driver.doomed or not ready or relay.popen.poll() is not None:
                continue
            if ready[0]["from_iteration"] <= last:
                relay.wait_event("step", min(self._remaining(), STEP_WAIT_S), iteration=last)

    def _save_events(self) -> None:
        """Every daemon's events as JSON lines beside its log (``<name>.events``), for a later look."""
        for daemon in self.swarm.daemons:
            lines = (json.dumps(e, default=str) for e in daemon.events)
            (self.work / f"{daemon.name}.events").write_text("\n".join(lines) + "\n")

    def _result(self, driver: ChaosDriver | None, error: str, started: float, ended: float) -> dict[str, Any]:
        s = self.setup
        crashes = [c.as_dict() for c in driver.crashes] if driver is not None else []
        figures = run_figures(crashes, self.holders, self.swarm.daemons, s.stages, s.microbatches_per_dh,
                              s.iterations, self.unplanned) if self.holders else {"violations": []}
        first = self.holders[0].of("first_microbatch") if self.holders else []
        violations = list(figures.pop("violations"))
        if error:
            violations.insert(0, error)
        during = sum(1 for c in crashes if 0 <= c["iteration"] < s.iterations)
        if during < int(s.iterations * s.rate + 1e-9):
            violations.append(f"{during} crashes while training, fewer than {s.rate} per iteration")
        trail = step_trail(self.swarm.daemons) if violations else []
        return {"seed": s.seed, "ok": not violations, "violations": violations, "setup": asdict(s),
                **(driver.summary() if driver is not None else {}), **figures, "trail": trail,
                "startup_s": first[0]["time"] - started if first else None,
                "train_s": ended - first[0]["time"] if first else None, "wall_s": ended - started}


TRAIL_EVENTS = ("ready", "step", "resync", "resynced", "crash_point")


def step_trail(daemons: list[Daemon]) -> list[str]:
    """A failed run's story in one line per event, oldest first: each node's start (stage, first iteration,
    where its state came from), steps (count, how agreed, members) and re-syncs: what a CI log shows."""
    lines = []
    for d in daemons:
        for e in d.events:
            name = e.get("event")
            if name not in TRAIL_EVENTS:
                continue
            detail = {k: e[k] for k in ("stage", "iteration", "from_iteration", "source", "count", "own_count",
                                        "agreement", "reason") if k in e}
            if "members" in e:
                detail["members"] = [m[-4:] for m in e["members"]]
            if "hash" in e:
                detail["hash"] = str(e["hash"])[:6]
            if "peer_id" in e:
                detail["peer"] = str(e["peer_id"])[-4:]
            lines.append((e.get("time", 0.0), f"{e.get('time', 0.0):.1f} {d.name} {name} {json.dumps(detail)}"))
    return [line for _, line in sorted(lines)]


def run_chaos(setup: ChaosSetup, work: Path) -> dict[str, Any]:
    """One chaos run in ``work`` (the daemons' logs stay there)."""
    return ChaosRun(setup, work).run()
