"""What a node tells Prometheus: figures read from its components at scrape time, and from its events.

``StartupMetrics`` (built first, in ``node.start``) covers the whole life: the node's state and its
start-up phases. ``NodeMetrics`` (built in ``assembly``) reads the serving components through narrow
views — the iteration gate, a relay's work counters, the flow driver's routes and edge costs, the
link table, the wire bytes the sender sent and the inbox received, the join's state download, the compute
thread — and counts what only events tell (recoveries, recomputed hops, steps, a data holder's
microbatches). ``TimedSteps`` times the iteration driver's ``gather`` and ``step`` (the aggregation).
The components know nothing of this module; every figure is collected on the event loop
(``metrics_http``). The names are listed in docs/status.md.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from gwtfp2p.daemon.aggregation.rounds import Gathered, Outcome
from gwtfp2p.daemon.datapath.iterations import PartStep
from gwtfp2p.daemon.lifecycle.metric_sources import Busy, Iteration, Joined, Routing, Sent, WorkCounters
from gwtfp2p.daemon.lifecycle.self_report import Identity, flow_neighbours
from gwtfp2p.daemon.lifecycle.traffic import RECEIVED_KINDS, SERVED_KINDS, CountedHandlers
from gwtfp2p.daemon.progress import STATES, NodeProgress
from gwtfp2p.daemon.swarm.links import LinkTable

logger = logging.getLogger(__name__)

AGGREGATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
MAX_LINK_SERIES = 64  # peers whose link figures are exported (a big swarm's placement pings everyone)


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def labelled(family: Callable[..., Metric], name: str, doc: str, labels: tuple[str, ...],
             values: Mapping[tuple[str, ...], float]) -> Metric:
    """One metric with a sample per label tuple (``family``: ``GaugeMetricFamily`` or ``CounterMetricFamily``)."""
    metric = family(name, doc, labels=list(labels))
    for key, value in sorted(values.items()):
        metric.add_metric(list(key), value)
    return metric


class Timings:
    """Observed durations in cumulative buckets, by one label (a Prometheus histogram)."""

    def __init__(self, bounds_s: tuple[float, ...] = AGGREGATION_BUCKETS_S) -> None:
        self.bounds_s = bounds_s
        self._counts: dict[str, list[int]] = {}
        self._sums: Counter[str] = Counter()

    def observe(self, label: str, seconds: float) -> None:
        counts = self._counts.setdefault(label, [0] * (len(self.bounds_s) + 1))
        counts[bisect.bisect_left(self.bounds_s, seconds)] += 1
        self._sums[label] += seconds

    def family(self, name: str, doc: str, label: str) -> HistogramMetricFamily:
        metric = HistogramMetricFamily(name, doc, labels=[label])
        for value, counts in sorted(self._counts.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*map(str, self.bounds_s), "+Inf"), counts, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            metric.add_metric([value], buckets, self._sums[value])
        return metric


class TimedSteps:
    """The iteration driver's ``gather`` (the all-gather and reduce) and ``step`` (the optimizer step),
    each timed with ``clock`` into ``timings`` (labels ``gather``, ``step``); failures are not timed."""

    def __init__(self, steps: PartStep, timings: Timings, clock: Callable[[], float]) -> None:
        self.steps = steps
        self.timings = timings
        self.clock = clock

    async def gather(self, iteration: int, tags: dict[str, Any] | None = None) -> Gathered:
        started = self.clock()
        gathered = await self.steps.gather(iteration, tags)
        self.timings.observe("gather", self.clock() - started)
        return gathered

    async def step(self, gathered: Gathered, total_sq_norm: float | None) -> Outcome:
        started = self.clock()
        outcome = await self.steps.step(gathered, total_sq_norm)
        self.timings.observe("step", self.clock() - started)
        return outcome


class StartupMetrics:
    """A collector of the node's state and start-up, from its ``NodeProgress`` and ``startup`` events."""

    def __init__(self, progress: NodeProgress) -> None:
        self.progress = progress
        self.phase_s: dict[str, float] = {}
        self.download_attempts = 0

    def observe(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name == "startup" and isinstance(event.get("phase"), str) and isinstance(event.get("seconds"), float):
            self.phase_s[event["phase"]] = event["seconds"]
        elif name == "downloading":
            self.download_attempts += 1

    def collect(self) -> Iterator[Metric]:
        p = self.progress
        yield labelled(GaugeMetricFamily, "gwtf_node_state", "1 for the node's state (joining, online, leaving)",
                       ("state",), {(state,): float(state == p.state) for state in STATES})
        yield gauge("gwtf_start_time_seconds", "Unix time the node started", p.started_at)
        if p.ready_at:
            yield gauge("gwtf_ready_time_seconds", "Unix time the node was ready to serve", p.ready_at)
        yield labelled(GaugeMetricFamily, "gwtf_startup_phase_seconds", "Seconds after the start at which each "
                       "start-up phase was done", ("phase",), {(k,): v for k, v in self.phase_s.items()})
        yield counter("gwtf_state_download_attempts", "State downloads tried while joining", self.download_attempts)


class NodeMetrics:
    """A collector of a serving node's figures (``observe`` takes its events; ``timed`` its aggregation).
    ``work`` is a relay's data path; None for a data holder, whose microbatches are counted from its
    ``iteration`` events."""

    def __init__(self, identity: Identity, progress: NodeProgress, *, gate: Iteration, work: WorkCounters | None,
                 routing: Routing, links: LinkTable, neighbour_stages: Iterable[int], sent: Sent,
                 received: CountedHandlers, compute: Busy, joined: Joined, clock: Callable[[], float]) -> None:
        self.identity = identity
        self.progress = progress
        self.gate = gate
        self.work = work
        self.routing = routing
        self.links = links
        self.neighbour_stages = tuple(sorted(set(neighbour_stages)))
        self.sent = sent
        self.received = received
        self.compute = compute
        self.joined = joined
        self.clock = clock
        self.aggregation = Timings()
        self.recoveries: Counter[str] = Counter()
        self.recomputed_hops = 0
        self.steps = 0
        self.holder_forwards = 0
        self.holder_backwards = 0

    def timed(self, steps: PartStep) -> TimedSteps:
        return TimedSteps(steps, self.aggregation, self.clock)

    def observe(self, event: dict[str, Any]) -> None:
        """Count what an event tells (never raises: it runs inside ``Events.emit``)."""
        name = event.get("event")
        if name == "recovery":
            self.recoveries[str(event.get("kind"))] += 1
            hops = event.get("recomputed_hops")
            self.recomputed_hops += hops if isinstance(hops, int) and hops > 0 else 0
        elif name == "step":
            self.steps += 1
        elif name == "iteration":
            self.steps += 1
            done, lost = event.get("microbatches"), event.get("lost_microbatches")
            if self.work is None and isinstance(done, int) and isinstance(lost, int):
                self.holder_forwards += done + lost
                self.holder_backwards += done

    def collect(self) -> Iterator[Metric]:
        yield from self._training()
        yield from self._flow()
        yield from self._traffic()
        yield from self._state()

    def _training(self) -> Iterator[Metric]:
        i, p, work = self.identity, self.progress, self.work
        yield InfoMetricFamily("gwtf_node", "Who this node is", value={
            "peer_id": i.peer_id, "role": i.role, "stage": str(i.stage), "run_id": i.run_id, "location": i.location})
        yield gauge("gwtf_iteration", "Aggregation steps this node's part has taken", self.gate.iteration)
        yield counter("gwtf_steps", "Aggregation steps taken since this node joined", self.steps)
        if p.loss is not None and math.isfinite(p.loss):
            yield gauge("gwtf_loss", "The swarm's mean loss in the last closed iteration", p.loss)
        yield gauge("gwtf_tokens_per_second", "The swarm's tokens per second in the last closed iteration",
                    p.tokens_per_s)
        forwards, backwards = ((work.forwards, work.backwards) if work is not None else
                               (self.holder_forwards, self.holder_backwards))
        yield counter("gwtf_microbatches_forwarded", "Forward passes of this node's part (a data holder: "
                      "microbatches embedded and sent, counted when their iteration closes)", forwards)
        yield counter("gwtf_microbatches_backwarded", "Backward passes of this node's part (a data holder: "
                      "microbatches closed by the head's backward, counted when their iteration closes)", backwards)
        if work is not None:
            yield gauge("gwtf_microbatches_in_flight", "Microbatches this relay holds (forwarded, gradient not "
                        "back yet)", work.in_flight)
        yield labelled(CounterMetricFamily, "gwtf_recoveries", "Recovery actions by kind (resends, re-pointed "
                       "hops, gradient resends, dropped data holders)", ("kind",),
                       {(k,): v for k, v in self.recoveries.items()})
        yield counter("gwtf_recomputed_hops", "Hops recomputed by this node's resends of lost microbatches",
                      self.recomputed_hops)
        yield self.aggregation.family("gwtf_aggregation_seconds", "Aggregation time per iteration: gather (the "
                                      "all-gather with the part's replicas and the reduce) and step (the "
                                      "optimizer step)", "phase")
        yield counter("gwtf_compute_busy_seconds", "Seconds the compute thread spent on torch work",
                      self.compute.busy_s)

    def _flow(self) -> Iterator[Metric]:
        rows = flow_neighbours(self.routing, self.links, self.neighbour_stages)
        yield gauge("gwtf_flow_units", "Complete flow units this node routes on (its DHT record's)",
                    sum(n for _, _, n in self.routing.summary()))
        yield labelled(GaugeMetricFamily, "gwtf_flow_units_in", "Routed flow units arriving from each flow "
                       "neighbour", ("peer",), {(n.peer,): n.units_in for n in rows if n.units_in})
        yield labelled(GaugeMetricFamily, "gwtf_flow_units_out", "Routed flow units going on to each flow "
                       "neighbour", ("peer",), {(n.peer,): n.units_out for n in rows if n.units_out})
        yield labelled(GaugeMetricFamily, "gwtf_edge_cost_seconds", "Edge cost d(self, peer) the flow uses, per "
                       "flow neighbour", ("peer", "peer_stage"),
                       {(n.peer, str(n.stage)): n.cost_s for n in rows if n.cost_s is not None})
        yield counter("gwtf_flow_messages_received", "Flow-protocol messages received", self.routing.messages_in)
        peers = self.links.peers()[:MAX_LINK_SERIES]
        yield labelled(GaugeMetricFamily, "gwtf_link_rtt_seconds", "Round-trip time to each measured peer (EMA "
                       "of pings)", ("peer",), {(peer,): self.links.rtt(peer) or 0.0 for peer in peers})
        measured = {peer: self.links.measured_bandwidth(peer) for peer in peers}
        yield labelled(GaugeMetricFamily, "gwtf_link_bandwidth_bytes_per_second", "Bandwidth to each peer measured "
                       "on transfers of 256 KiB or more (EMA)", ("peer",),
                       {(peer,): bw for peer, bw in measured.items() if bw is not None})

    def _traffic(self) -> Iterator[Metric]:
        received, sent = self.received, self.sent.traffic
        yield labelled(CounterMetricFamily, "gwtf_sent_bytes", "Wire bytes of the transfers sent and acknowledged, "
                       "by kind (forwards, backwards, aggregation contributions)", ("kind",),
                       {("forward",): sent.forward_bytes, ("backward",): sent.backward_bytes,
                        ("aggregation",): sent.aggregation_bytes})
        yield labelled(CounterMetricFamily, "gwtf_sent_messages", "Transfers sent and acknowledged, by kind",
                       ("kind",), {("forward",): sent.forwards, ("backward",): sent.backwards,
                                   ("aggregation",): sent.aggregation_messages})
        yield labelled(CounterMetricFamily, "gwtf_received_bytes", "Bytes received by kind (wire bytes of forwards, "
                       "backwards and aggregation contributions; flow and control messages)", ("kind",),
                       {(k,): received.received_bytes[k] for k in RECEIVED_KINDS})
        yield labelled(CounterMetricFamily, "gwtf_received_messages", "Transfers and messages received by kind",
                       ("kind",), {(k,): received.received[k] for k in RECEIVED_KINDS})
        yield labelled(CounterMetricFamily, "gwtf_served", "States and step logs served to joining replicas",
                       ("kind",), {(k,): received.served[k] for k in SERVED_KINDS})
        yield labelled(CounterMetricFamily, "gwtf_served_bytes", "Bytes of states and step logs served to joining "
                       "replicas", ("kind",), {(k,): received.served_bytes[k] for k in SERVED_KINDS})

    def _state(self) -> Iterator[Metric]:
        j = self.joined
        downloaded = j.source == "replica"
        yield counter("gwtf_state_downloads", "Part states this node downloaded from a replica when it joined",
                      int(downloaded))
        yield gauge("gwtf_state_download_bytes", "Size of the state downloaded at the join (0: none)",
                    j.state_bytes if downloaded else 0)
        yield gauge("gwtf_state_download_seconds", "Time the state download at the join took (0: none)",
                    j.download_s if downloaded else 0.0)
        yield counter("gwtf_replayed_steps", "Steps replayed from a replica's step log at the join",
                      j.replayed_steps)
