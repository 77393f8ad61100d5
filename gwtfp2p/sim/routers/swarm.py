"""The ``swarm`` router: SWARM parallelism's released routing and recovery on the shared data plane.

Each data holder (a SWARM trainer) keeps one ``Balancer`` per stage and picks every forward hop of
its microbatches with it; backward goes to the replica holding the activations (the shared data
plane) and is charged to that replica with SWARM's backward task size (2.5 × the forward's). The
trainer sees replicas through DHT records: servers re-declare every 30 s with a 300 s expiration,
and each trainer refreshes its balancers every 30 s, so a joiner is found within 30 s and a dead
replica stays listed until its record expires. A request fails after SWARM's fixed timeouts
(30 s forward, 75 s backward) when its server vanished, or after a round trip when the host
refuses the connection; the replica is then banned until its record expires and the hop is
retried on another replica, which recomputes it (inputs, and the gradient if any, are resent).
"""

from __future__ import annotations

import random

from gwtfp2p.sim.cluster import FORWARD
from gwtfp2p.sim.microbatch import FWD_DONE, IN_FWD, QUEUED_BWD, QUEUED_FWD, Microbatch
from gwtfp2p.sim.routers.balancer import Balancer
from gwtfp2p.sim.routers.base import Router


class SwarmRouter(Router):
    name = "swarm"
    dedupe_by_duplicate = False

    def __init__(self, sim) -> None:
        super().__init__(sim)
        self.params = sim.scenario.swarm
        self.crash_mode = sim.scenario.dataplane.crash_mode
        self.n_stages = sim.scenario.n_stages
        self.forward_task = float(sim.model.microbatch)
        self.backward_task = self.forward_task * self.params.backward_task_multiplier
        self.rng = random.Random(f"swarm:{sim.scenario.name}:{sim.seed}")
        self.declared_at: dict[str, float] = {}  # replica -> when it first declared itself
        self.balancers: dict[str, list[Balancer | None]] = {}
        self.fallbacks = 0

    # -- DHT records -------------------------------------------------------------------------------
    def start(self) -> None:
        for stage in range(1, self.n_stages + 1):
            for node_id in self.sim.cluster.active_by_stage[stage]:
                self.declared_at[node_id] = self.engine.now
        period = self.params.balancer_update_period_s
        for dh in self.sim.iterations.dhs:
            self.balancers[dh] = [None] + [Balancer(self.params, self.rng) for _ in range(self.n_stages)]
            self._refresh(dh)
            self.engine.at(self.engine.now + self.rng.uniform(0.0, period), self._periodic_refresh, dh)

    def on_activate(self, node_id: str) -> None:
        self.declared_at[node_id] = self.engine.now

    def _record_expiration(self, node_id: str, now: float) -> float:
        """Expiration of the replica's DHT record as of ``now`` (declarations stop when it dies)."""
        start = self.declared_at[node_id]
        last_seen = min(now, self.nodes[node_id].died_s)
        period = self.params.declare_period_s
        last_declared = start + int((last_seen - start) // period) * period
        return last_declared + self.params.record_expiration_s

    def _records(self, stage: int, now: float) -> dict[str, float]:
        records = {}
        for node_id in self.declared_at:
            if self.nodes[node_id].stage == stage:
                expiration = self._record_expiration(node_id, now)
                if expiration > now:
                    records[node_id] = expiration
        return records

    def _refresh(self, dh: str) -> None:
        now = self.engine.now
        for stage in range(1, self.n_stages + 1):
            self.balancers[dh][stage].update(self._records(stage, now), now)

    def _periodic_refresh(self, dh: str) -> None:
        self._refresh(dh)
        self.engine.at(self.engine.now + self.params.balancer_update_period_s, self._periodic_refresh, dh)

    def _choose(self, dh: str, stage: int, task_size: float) -> str:
        balancer = self.balancers[dh][stage]
        now = self.engine.now
        uid = balancer.choose(task_size, now)
        if uid is None:  # the released client blocks on a forced refresh: do it now
            self._refresh(dh)
            uid = balancer.choose(task_size, now)
        if uid is None:  # nothing listed at all (never in our scenarios): take any live replica
            self.fallbacks += 1
            live = [n for n in self.sim.cluster.active_by_stage[stage] if self.nodes[n].alive]
            uid = live[0] if live else self.sim.cluster.active_by_stage[stage][0]
        return uid

    # -- routing -----------------------------------------------------------------------------------
    def first_hop(self, dh: str, m: Microbatch) -> tuple[str, object]:
        return self._choose(dh, 1, self.forward_task), None

    def next_hop(self, node_id: str, m: Microbatch, pos: int) -> tuple[str, object]:
        return self._choose(m.dh, pos, self.forward_task), None

    def replacement(self, sender: str, m: Microbatch, pos: int, dead: str) -> str | None:
        backward = m.state[pos + 1] >= QUEUED_BWD or m.state[pos] >= QUEUED_BWD
        return self._choose(m.dh, pos, self.backward_task if backward else self.forward_task)

    def believes_alive(self, observer: str, node_id: str) -> bool:
        return True  # SWARM learns of a dead replica only from a failed request

    def detector_alive(self, m: Microbatch, sender: str) -> bool:
        return True  # the trainer (data holder) waits for every request and never crashes

    # -- measurements ------------------------------------------------------------------------------
    def on_forward_delivered(self, m: Microbatch, pos: int, interval_s: float) -> None:
        self.balancers[m.dh][pos].observe(m.holder[pos], self.forward_task, interval_s)

    def on_backward_sent(self, m: Microbatch, pos: int) -> None:
        self.balancers[m.dh][pos].charge(m.holder[pos], self.backward_task)

    def on_backward_delivered(self, m: Microbatch, pos: int, interval_s: float) -> None:
        self.balancers[m.dh][pos].observe(m.holder[pos], self.backward_task, interval_s)

    # -- failures ----------------------------------------------------------------------------------
    def holder_crash_detect(self, m: Microbatch, pos: int, dead: str, crash_s: float,
                            phase_u: float) -> float | None:
        state = m.state[pos]
        if state in (IN_FWD,):
            return None  # noticed when the input reaches the dead server
        forward_pending = state == QUEUED_FWD or (
            state == FWD_DONE and m.state[pos + 1] == IN_FWD and m.fwd_depart[pos + 1] > crash_s)
        if state == FWD_DONE and not forward_pending:
            return None  # its request completed; the loss shows when the backward is sent to it
        if self.crash_mode == "refused":  # the connection is reset
            return crash_s + self.sim.network.link(dead, m.holder[pos - 1])[0]
        if forward_pending:
            return m.request_start[pos] + self.params.forward_timeout_s
        if state < QUEUED_BWD:
            return None  # the gradient is on its way: noticed when it arrives
        return m.request_start[pos] + self.params.backward_timeout_s

    def send_failure_detect(self, m: Microbatch, pos: int, kind: int, sender: str, dead: str,
                            sent_s: float) -> float:
        if self.crash_mode == "refused":
            return sent_s + self.sim.network.round_trip_s(sender, dead)
        timeout = self.params.forward_timeout_s if kind == FORWARD else self.params.backward_timeout_s
        return m.request_start[pos] + timeout

    def on_failure_detected(self, m: Microbatch, observer: str, dead: str) -> None:
        self.balancers[m.dh][self.nodes[dead].stage].ban(dead, self.engine.now)
