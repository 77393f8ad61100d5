"""SWARM's client-side load balancer, as released (yandex-research/swarm
``swarm/pipeline/src/moe/client/balancer.py``, ``ExpertBalancer``; cited below as balancer.py, and
``swarm/pipeline/src/optim/performance_ema.py`` as performance_ema.py).

Per stage and per trainer process, a min-heap of projected busy time. Choosing a replica pops the
one with the least, adds ``task_size / throughput`` (or ``initial_seconds_per_sample × task_size``
while it has no measurement) and pushes it back (balancer.py:111-128); the load is never taken
off again. A replica seen for the first time enters at the heap's current minimum, so it is
probed at once (balancer.py:79-86). Throughput is a bias-corrected EMA (α = 0.1) of seconds per
sample over completed requests only (``PerformanceEMA``, performance_ema.py:21-38; a failed
request raises before the measurement, balancer.py:130-144). A request that failed with an error
bans the replica until its DHT record expires (balancer.py:90-98, 139-144); a timeout does not
(balancer.py:136-138). An expired record drops the replica when it is next popped
(balancer.py:113-120).
"""

from __future__ import annotations

import heapq
import random

from gwtfp2p.sim.params import SwarmParams


class PerformanceEma:
    """Adjusted exponential moving average of seconds per sample (hivemind/SWARM PerformanceEMA)."""

    __slots__ = ("alpha", "ema_seconds_per_sample", "updates")

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.ema_seconds_per_sample = 0.0
        self.updates = 0

    def update(self, task_size: float, interval_s: float) -> None:
        self.ema_seconds_per_sample = (self.alpha * interval_s / task_size
                                       + (1 - self.alpha) * self.ema_seconds_per_sample)
        self.updates += 1

    def seconds_per_sample(self) -> float:
        return self.ema_seconds_per_sample / (1 - (1 - self.alpha) ** self.updates)


class Balancer:
    """One client's view of one stage's replicas."""

    def __init__(self, params: SwarmParams, rng: random.Random) -> None:
        self.params = params
        self.rng = rng
        self.queue: list[tuple[float, float, str]] = []
        self.entry: dict[str, tuple[float, float, str]] = {}
        self.ema: dict[str, PerformanceEma] = {}
        self.expiration: dict[str, float] = {}  # known DHT record expiration per replica
        self.banned: dict[str, float] = {}  # replica -> ban expiration

    def update(self, records: dict[str, float], now: float) -> None:
        """Fold in the DHT's current records (replica -> expiration), as the background refresh does."""
        for uid in sorted(records):
            expiration = records[uid]
            ban = self.banned.get(uid)
            if ban is not None and ban < now:
                del self.banned[uid]
                ban = None
            if ban is None or expiration > ban:
                self._add(uid, expiration)

    def _add(self, uid: str, expiration: float) -> None:
        self.expiration[uid] = expiration
        if uid in self.entry:
            return
        self.ema[uid] = PerformanceEma(self.params.ema_alpha)
        base = self.queue[0][0] if self.queue else 0.0
        entry = (base, self.rng.random(), uid)
        heapq.heappush(self.queue, entry)
        self.entry[uid] = entry

    def choose(self, task_size: float, now: float) -> str | None:
        """Pop the least-loaded live replica, charge it the task, push it back (None: heap empty)."""
        while self.queue:
            entry = heapq.heappop(self.queue)
            load, _, uid = entry
            if self.expiration.get(uid, -1.0) < now:  # the record expired: forget the replica
                self.expiration.pop(uid, None)
                if self.entry.get(uid) is entry:
                    del self.entry[uid]
                    self.ema.pop(uid, None)
                continue
            if self.entry.get(uid) is not entry:
                continue  # a stale heap entry (banned, expired or re-charged since)
            self._push(uid, load + self.expected_s(uid, task_size))
            return uid
        return None

    def _push(self, uid: str, load: float) -> None:
        entry = (load, self.rng.random(), uid)
        heapq.heappush(self.queue, entry)
        self.entry[uid] = entry

    def expected_s(self, uid: str, task_size: float) -> float:
        ema = self.ema.get(uid)
        if ema is None or ema.updates == 0:
            return self.params.initial_seconds_per_sample * task_size
        return task_size * ema.seconds_per_sample()

    def observe(self, uid: str, task_size: float, interval_s: float) -> None:
        ema = self.ema.get(uid)
        if ema is not None:
            ema.update(task_size, max(0.0, interval_s))

    def ban(self, uid: str, now: float) -> None:
        """A request to ``uid`` failed with an error: ban it until its known record expires."""
        if uid in self.banned and self.banned[uid] >= now:
            return
        self.banned[uid] = self.expiration.pop(uid, now)
        self.entry.pop(uid, None)
        self.ema.pop(uid, None)
