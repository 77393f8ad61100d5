"""What a gwtf node knows of its neighbours: measured link costs and when it learns of a death.

As the daemon measures them (gwtfp2p/daemon ``links.py``, ``peers.py``, ``liveness.py``):

* **Edge costs.** A node pings each neighbour when it meets it and every ``probe_period_s`` after;
  a ping sees the round trip plus queueing (RTT × (1 + an exponential draw)). Round trips and the
  bandwidth seen on activation transfers (size / (time to the ack − RTT), queueing included) are
  exponential moving averages; the bandwidth is a default until a transfer was seen. The edge
  cost d(i,j) is the paper's formula over these estimates and the declared compute times; it
  reaches the flow through the daemon's ``SettledCosts`` (a change that outlasts the noise).
* **Deaths.** Each node learns of a crash on its own. Refused crashes: after a lognormal draw with
  the mean and 95th percentile the daemon's chaos runs measured (docs/churn.md). Silent crashes:
  the liveness record expires two heartbeats after the last one (the crash falls ``phase_u`` of a
  period after it), the node reads the DHT at its own phase within a heartbeat, then pings the
  suspect and waits out the ping timeout.

Pure: draws come from per-pair seeded generators, so a run does not depend on event order.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist

from gwtfp2p.flow.costs import SettledCosts, edge_cost_s
from gwtfp2p.sim.params import SensingParams

MIN_BANDWIDTH_SAMPLE_BYTES = 256 * 1024  # the daemon ignores smaller transfers (links.py)
Z95 = NormalDist().inv_cdf(0.95)


def lognormal_for(mean_s: float, p95_s: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 95th percentile (the narrower solution)."""
    # mean = exp(mu + sigma^2 / 2), p95 = exp(mu + z sigma)  =>  sigma^2 / 2 - z sigma + ln(p95 / mean) = 0
    gap = math.log(p95_s / mean_s)
    sigma = Z95 - math.sqrt(max(0.0, Z95 * Z95 - 2.0 * gap))
    return math.log(mean_s) - sigma * sigma / 2.0, sigma


class Ema:
    """Exponential moving average; the first sample initializes it (daemon ``links.Ema``)."""

    __slots__ = ("alpha", "value")

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else (1 - self.alpha) * self.value + self.alpha * sample


class Sensing:
    """Every node's link estimates and death notices, for one run."""

    def __init__(self, params: SensingParams, crash_mode: str, seed: int) -> None:
        self.params = params
        self.refused = crash_mode == "refused"
        self.seed = seed
        self.mu, self.sigma = lognormal_for(params.refused_detect_mean_s, params.refused_detect_p95_s)
        self._rtt: dict[tuple[str, str], Ema] = {}
        self._bandwidth: dict[tuple[str, str], Ema] = {}
        self._probes: dict[tuple[str, str], random.Random] = {}
        self._flow_costs = SettledCosts(params.cost_settling)

    # -- links -----------------------------------------------------------------------------------
    def ping(self, observer: str, peer: str, rtt_s: float) -> None:
        """``observer`` pings ``peer`` whose true round trip is ``rtt_s``."""
        key = (observer, peer)
        rng = self._probes.get(key)
        if rng is None:
            rng = self._probes[key] = random.Random(f"probe:{self.seed}:{observer}:{peer}")
        jitter = self.params.probe_jitter_fraction
        sample = rtt_s * (1.0 + (rng.expovariate(1.0 / jitter) if jitter > 0 else 0.0))
        ema = self._rtt.get(key)
        if ema is None:
            ema = self._rtt[key] = Ema(self.params.rtt_ema_alpha)
        ema.add(sample)

    def transfer_acked(self, sender: str, receiver: str, size_bytes: float, seconds: float) -> None:
        """A transfer took ``seconds`` from the send to the receiver's ack."""
        if size_bytes < MIN_BANDWIDTH_SAMPLE_BYTES:
            return
        key = (sender, receiver)
        rtt = self._rtt.get(key)
        wire_s = max(seconds - (rtt.value if rtt is not None and rtt.value is not None else 0.0), 1e-4)
        ema = self._bandwidth.get(key)
        if ema is None:
            ema = self._bandwidth[key] = Ema(self.params.bandwidth_ema_alpha)
        ema.add(size_bytes / wire_s)

    def cost(self, observer: str, peer: str, own_compute_s: float, peer_compute_s: float,
             size_bytes: float) -> float | None:
        """d(observer, peer) from ``observer``'s estimates, or None before its first ping."""
        rtt = self._rtt.get((observer, peer))
        if rtt is None or rtt.value is None:
            return None
        ema = self._bandwidth.get((observer, peer))
        bandwidth = self.params.default_bandwidth_bytes_per_s
        if ema is not None and ema.value is not None:
            bandwidth = ema.value
        return edge_cost_s(own_compute_s, peer_compute_s, rtt.value / 2, rtt.value / 2, bandwidth, bandwidth,
                           size_bytes)

    def flow_update(self, observer: str, peer: str, cost: float) -> float | None:
        """The cost ``observer``'s flow should now hold for ``peer``, or None to keep its own."""
        return self._flow_costs.offer((observer, peer), cost)

    def forget(self, observer: str, peer: str) -> None:
        for table in (self._rtt, self._bandwidth):
            table.pop((observer, peer), None)
        self._flow_costs.forget((observer, peer))

    # -- deaths ----------------------------------------------------------------------------------
    def detect_delay_s(self, observer: str, dead: str, phase_u: float) -> float:
        """How long after ``dead``'s crash ``observer`` holds it for dead."""
        rng = random.Random(f"detect:{self.seed}:{observer}:{dead}")
        if self.refused:
            return rng.lognormvariate(self.mu, self.sigma)
        p = self.params
        expiry = p.heartbeat_s * (2.0 - phase_u)  # the last beat was phase_u periods before the crash
        return expiry + rng.uniform(0.0, p.heartbeat_s) + p.ping_timeout_s
