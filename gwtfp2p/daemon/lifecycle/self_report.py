"""What a node says about itself: its DHT record and its periodic ``progress`` event.

While it joins, a node publishes what it knows already (``joining_record``: role, stage, addresses,
its compute estimate). Once serving, ``SelfReport`` builds the record fresh for every heartbeat from
the components that know each figure (links, routing, the part's hash and the hashes of its last steps,
``recent_hashes``, so replicas compare at equal iterations; the swarm's loss), bounded to
the record's limits (``MAX_LINKS`` links, ``MAX_ROUTES`` routing lines) so it always encodes under the
DHT cap; and the ``progress`` event's fields, with its flow neighbours (``flow_neighbours``: the link,
the edge cost and the units to and from each, also what the metrics show).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.dht import MAX_LINKS, MAX_ROUTES, LinkStats, NodeRecord, RouteSummary
from gwtfp2p.dht.records import HASH_HISTORY_STEPS, MAX_EXCLUDED, ExcludedPeer, pick_recent_hashes
from gwtfp2p.flow.node import Route

MAX_RTT_S = 600.0
MAX_COMPUTE_S = 86_400.0
MAX_NEIGHBOURS_REPORTED = 16  # flow neighbours listed in a ``progress`` event


@dataclass(frozen=True)
class Identity:
    """What does not change while a node serves."""

    run_id: str
    peer_id: str
    role: str  # data | relay
    stage: int
    capacity: int
    maddrs: tuple[str, ...]
    location: str


def joining_record(identity: Identity, progress: NodeProgress, iteration: int = 0) -> NodeRecord:
    """The record of a node that is still joining (no links, no routing, no state yet)."""
    return _record(identity, progress, iteration=iteration, compute_s=progress.prior_compute_s)


def _record(identity: Identity, progress: NodeProgress, *, iteration: int, compute_s: float,
            links: dict[str, LinkStats] | None = None, routing: tuple[RouteSummary, ...] = (),
            weight_hash: str = "", recent_hashes: tuple[tuple[int, str], ...] = ()) -> NodeRecord:
    loss = progress.loss if progress.loss is not None and abs(progress.loss) < 1e6 else None
    return NodeRecord(
        run_id=identity.run_id, peer_id=identity.peer_id, role=identity.role, stage=identity.stage,
        state=progress.state, capacity=identity.capacity, compute_s=min(compute_s, MAX_COMPUTE_S),
        maddrs=identity.maddrs, iteration=iteration, location=identity.location, links=links or {},
        routing=routing, weight_hash=weight_hash, recent_hashes=recent_hashes, loss=loss,
        tokens_per_s=max(0.0, progress.tokens_per_s))


class RoutingSummary(Protocol):
    def summary(self) -> list[tuple[str, str, int]]: ...


class FlowNeighbours(Protocol):
    """The flow driver as far as a node's neighbours go: who they are, their edge costs, the units."""

    def neighbours(self, stage: int | None = None) -> list[str]: ...

    def cost(self, peer: str) -> float | None: ...

    def routes(self) -> list[Route]: ...


class Routing(RoutingSummary, FlowNeighbours, Protocol):
    pass


@dataclass(frozen=True)
class Neighbour:
    """One flow neighbour as this node measures it: the link, the edge cost, the units to and from it."""

    peer: str
    stage: int
    rtt_s: float | None  # None: not measured yet
    bandwidth_bytes_per_s: float  # the configured default until a large transfer was measured
    cost_s: float | None  # the edge cost d(self, peer) the flow uses; None: not known yet
    units_in: int  # routed units that arrive from it
    units_out: int  # routed units that go on to it


def flow_neighbours(routing: FlowNeighbours, links: LinkTable, stages: Iterable[int]) -> list[Neighbour]:
    """This node's flow neighbours of ``stages``, by stage then peer id."""
    routes = routing.routes()
    units_in = Counter(r.prev for r in routes if r.in_edge and r.prev)
    units_out = Counter(r.next for r in routes if r.out_edge and r.next)
    return [Neighbour(peer, stage, links.rtt(peer), float(links.bandwidth(peer)), routing.cost(peer),
                      units_in[peer], units_out[peer])
            for stage in sorted(set(stages)) for peer in routing.neighbours(stage)]


def neighbour_fields(neighbours: list[Neighbour]) -> list[dict]:
    """The ``progress`` event's ``neighbours``: the busiest ``MAX_NEIGHBOURS_REPORTED``, in milliseconds."""
    busiest = sorted(neighbours, key=lambda n: (-(n.units_in + n.units_out), n.stage, n.peer))
    return [{"peer": n.peer, "stage": n.stage, "units_in": n.units_in, "units_out": n.units_out,
             "rtt_ms": None if n.rtt_s is None else round(n.rtt_s * 1000, 2),
             "cost_ms": None if n.cost_s is None else round(n.cost_s * 1000, 2)}
            for n in busiest[:MAX_NEIGHBOURS_REPORTED]]


class StepHashes:
    """The hash after each of the part's last steps, from the node's events (a relay's ``step``, a data
    holder's ``iteration``): the record's ``recent_hashes``, so replicas compare at equal iterations. A
    ``resynced`` part starts a new history (what it stepped before is not the stage's)."""

    def __init__(self) -> None:
        self._steps: deque[tuple[int, str]] = deque(maxlen=HASH_HISTORY_STEPS)

    def on_event(self, event: dict) -> None:
        name = event.get("event")
        if name in ("step", "iteration") and isinstance(event.get("hash"), str) and event["hash"]:
            self._steps.append((int(event["iteration"]), event["hash"]))
        elif name == "resynced":
            self._steps.clear()

    def history(self) -> list[tuple[int, str]]:
        return list(self._steps)

    def recent(self) -> tuple[tuple[int, str], ...]:
        return pick_recent_hashes(self.history())


class WorkCounters(Protocol):
    """A relay's data path counts its work; a data holder's does not report these."""

    forwards: int
    backwards: int
    in_flight: int


class SelfReport:
    """The serving node's record and ``progress`` fields, read from the components that know them."""

    def __init__(self, identity: Identity, progress: NodeProgress, *, links: LinkTable, routing: Routing,
                 neighbour_stages: Iterable[int], weight_hash: Callable[[], str], iteration: Callable[[], int],
                 compute_s: Callable[[], float], peers: Callable[[], int], counters: WorkCounters | None,
                 excluded: Callable[[], list[tuple[str, str]]] = list) -> None:
        self.identity = identity
        self.progress = progress
        self.links = links
        self.routing = routing
        self.neighbour_stages = tuple(sorted(set(neighbour_stages)))
        self.weight_hash = weight_hash
        self.iteration = iteration
        self.compute_s = compute_s
        self.peers = peers
        self.counters = counters
        self.excluded = excluded  # (peer, reason) of the peers this node excluded for misbehaviour, oldest first
        self.hashes = StepHashes()

    def record(self) -> NodeRecord:
        links = {}
        for peer in self.links.peers()[:MAX_LINKS]:
            rtt = min(self.links.rtt(peer) or 0.0, MAX_RTT_S)
            links[peer] = LinkStats(rtt_s=rtt, bandwidth_bytes_per_s=float(self.links.bandwidth(peer)))
        routes = tuple(RouteSummary(next_peer=n, sink=s, units=u) for n, s, u in self.routing.summary()[:MAX_ROUTES])
        excluded = tuple(ExcludedPeer(peer=p, reason=why[:96]) for p, why in self.excluded()[-MAX_EXCLUDED:])
        return _record(self.identity, self.progress, iteration=self.iteration(), compute_s=self.compute_s(),
                       links=links, routing=routes, weight_hash=self.weight_hash(),
                       recent_hashes=self.hashes.recent()).model_copy(update={"excluded": excluded})

    def progress_fields(self) -> dict:
        fields = {"role": self.identity.role, "stage": self.identity.stage, "iteration": self.iteration(),
                  "units": sum(n for _, _, n in self.routing.summary()), "peers": self.peers(),
                  "compute_ms": round(self.compute_s() * 1000, 2), "loss": self.progress.loss,
                  "tokens_per_s": self.progress.tokens_per_s,
                  "neighbours": neighbour_fields(self.neighbours())}
        if self.counters is not None:
            fields.update(forwards=self.counters.forwards, backwards=self.counters.backwards,
                          in_flight=self.counters.in_flight)
        return fields

    def neighbours(self) -> list[Neighbour]:
        return flow_neighbours(self.routing, self.links, self.neighbour_stages)
