"""The serving node's components, built in dependency order once its part is joined: who gets whom.

``assemble`` is pure construction (no I/O, no awaits): each component receives its collaborators
through its constructor, as narrow as it needs them, and subscribes to the failure detector in the
order deaths must be handled (flow neighbours, then the data path, then aggregation). What it builds
on (``Base``: the DHT, transport, view, links, liveness, sender; the part and its joined state) is
the lifecycle's (``node``). With ``--metrics-port``, ``NodeMetrics`` reads the components built here,
hears the node's events and times the aggregation steps; no component knows of it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gwtfp2p.config import FlowParams, RunSpec
from gwtfp2p.daemon.aggregation.admission import Admission
from gwtfp2p.daemon.aggregation.aggregator import Aggregator
from gwtfp2p.daemon.aggregation.checkpoint import CheckpointWriter
from gwtfp2p.daemon.aggregation.joining import Joiner
from gwtfp2p.daemon.aggregation.members import MemberTable
from gwtfp2p.daemon.aggregation.membership import Membership
from gwtfp2p.daemon.aggregation.resync import Resync
from gwtfp2p.daemon.aggregation.state import PartState, StateServer
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.config import NodeConfig
from gwtfp2p.daemon.datapath.clipping import GlobalClip
from gwtfp2p.daemon.datapath.crosscheck import CrossCheck
from gwtfp2p.daemon.datapath.gate import IterationGate
from gwtfp2p.daemon.datapath.holder import HolderPath, HolderRole
from gwtfp2p.daemon.datapath.iterations import Closing, IterationDriver, IterationRole
from gwtfp2p.daemon.datapath.outbox import Outbox
from gwtfp2p.daemon.datapath.receiver import HopReceiver, HopTable
from gwtfp2p.daemon.datapath.recovery import Recovery
from gwtfp2p.daemon.datapath.redo import LostWork
from gwtfp2p.daemon.datapath.relay import RelayPath, RelayRole, relay_other_hop
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.lifecycle.guard import Guard, Shape
from gwtfp2p.daemon.lifecycle.inbox import Receivers
from gwtfp2p.daemon.lifecycle.metric_sources import Joined
from gwtfp2p.daemon.lifecycle.metrics import NodeMetrics
from gwtfp2p.daemon.lifecycle.metrics_http import MetricsEndpoint
from gwtfp2p.daemon.lifecycle.self_report import Identity, SelfReport
from gwtfp2p.daemon.lifecycle.traffic import CountedHandlers
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.swarm.directory import SwarmDirectory
from gwtfp2p.daemon.swarm.instance import spec_activation_bytes
from gwtfp2p.daemon.swarm.links import Ema, LinkTable
from gwtfp2p.daemon.swarm.liveness import Liveness
from gwtfp2p.daemon.swarm.neighbours import Neighbours, neighbour_stages
from gwtfp2p.daemon.swarm.outage import OutageWatch
from gwtfp2p.daemon.swarm.peers import PeerBook
from gwtfp2p.daemon.swarm.routing import FlowDriver
from gwtfp2p.daemon.swarm.sending import Sender
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.swarm.watch import SwarmWatch
from gwtfp2p.daemon.testing import misbehave
from gwtfp2p.daemon.timeouts import Deadlines
from gwtfp2p.flow.node import FlowNode
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.transport import Transport

if TYPE_CHECKING:
    from gwtfp2p.model.data import MicrobatchSampler


@dataclass(frozen=True)
class Base:
    """What a node has before it knows its part: built by ``node.start`` step by step."""

    config: NodeConfig
    events: Events
    progress: NodeProgress
    compute: ComputeThread
    transport: Transport
    view: SwarmView
    links: LinkTable
    liveness: Liveness
    sender: Sender
    deadlines: Deadlines
    spec: RunSpec
    identity: Identity
    traffic: CountedHandlers  # what reaches the inbox, counted
    metrics: MetricsEndpoint | None  # --metrics-port's endpoint; None: no metrics


@dataclass(frozen=True)
class Assembly:
    """The serving node's components."""

    gate: IterationGate
    members: MemberTable
    membership: Membership
    state: PartState
    aggregator: Aggregator
    routing: FlowDriver
    neighbours: Neighbours
    path: RelayPath | HolderPath
    outbox: Outbox
    recovery: Recovery
    receiver: HopReceiver
    driver: IterationDriver
    watch: SwarmWatch
    report: SelfReport
    receivers: Receivers
    clip: GlobalClip | None  # None: the run clips each part by its own norm
    metrics: NodeMetrics | None  # None: no --metrics-port
    outage: OutageWatch | None = None  # redials the swarm when every peer is lost
    checker: CrossCheck | None = None  # the two-replica output checks, both sides
    redo: LostWork | None = None  # lost contributions: answering for them, and (relays) redoing them


def own_compute_s(measured: Ema, progress: NodeProgress) -> Callable[[], float]:
    """Forward + backward seconds per microbatch: measured once there is a sample, else the estimate (as a
    modified daemon would claim it: ``misbehave``, tests only)."""
    return lambda: misbehave.claimed_compute_s(measured.value if measured.value is not None
                                               else progress.prior_compute_s)


@dataclass(frozen=True)
class _Replicas:
    gate: IterationGate
    members: MemberTable
    state: PartState
    aggregator: Aggregator
    membership: Membership
    peers: PeerBook


@dataclass(frozen=True)
class _Flow:
    routing: FlowDriver
    neighbours: Neighbours
    directory: SwarmDirectory
    compute_s: Callable[[], float]
    measured: Ema


def assemble(base: Base, part: StageExecutor | DataHolderExecutor, sampler: MicrobatchSampler | None,
             from_iteration: int, accepted: list[str], joined: Joined, joiner: Joiner | None = None) -> Assembly:
    """Every serving component of a node whose part holds ``from_iteration`` steps (``accepted``: the
    same-part peers that took it as a member at the join; ``joined``: how its state came, for the metrics)."""
    replicas = _replicas(base, part, from_iteration, accepted, "" if joiner is None else joiner.loaded_hash)
    flow = _flow(base, replicas.membership)
    return _datapath(base, part, sampler, replicas, flow, joined, joiner)


def _replicas(base: Base, part: StageExecutor | DataHolderExecutor, from_iteration: int,
              accepted: list[str], state_hash: str) -> _Replicas:
    """The part's iteration gate, its members and the aggregation over them (the part's state: ``state_hash``)."""
    t, me, stage, view = base.config.timings, base.identity.peer_id, base.identity.stage, base.view
    gate = IterationGate(from_iteration)
    members = MemberTable(me, from_iteration)
    for peer in accepted:  # they took us from from_iteration: expect them, whatever the DHT says
        members.add(peer, from_iteration)
    storage = base.config.storage
    state = PartState(part, from_iteration, storage.replay_steps, storage.replay_budget_mib * 2**20, state_hash)
    peers = PeerBook(me, view.dht.node_key, lambda: view.seen, view.dht.verify_signatures)
    admission = Admission(me, stage, peers, numel=part.numel,
                          tokens_per_microbatch=base.spec.microbatch_size * base.spec.seq_len,
                          exclude=base.liveness.exclude)
    aggregator = Aggregator(me, stage, members, state, compute=base.compute, sender=base.sender,
                            prober=base.liveness, online_peers=lambda: view.online(stage), events=base.events,
                            timings=t, clock=time.monotonic, admission=admission)
    membership = Membership(stage, members, transport=base.transport,
                            same_part_peers=lambda: [r.peer_id for r in view.by_stage(stage)],
                            fixed_through=aggregator.fixed_through, iteration=lambda: gate.iteration,
                            timeout_s=t.message_timeout_s)
    return _Replicas(gate, members, state, aggregator, membership, peers)


def _flow(base: Base, membership: Membership) -> _Flow:
    """The node's flow protocol on the wire, its neighbours, and the swarm as the data plane asks about it."""
    c, spec, t, me = base.config, base.spec, base.config.timings, base.identity.peer_id
    stage, n_stages = base.identity.stage, spec.n_stages
    flow = FlowNode(me, stage, n_stages, capacity=0 if c.is_data_holder else c.relay_capacity,
                    supply=spec.microbatches_per_dh if c.is_data_holder else 0, params=FlowParams(tick_s=t.tick_s),
                    rng=random.Random(f"{spec.seed}:{me}"))
    routing = FlowDriver(flow, n_stages, base.transport, t.tick_s, t.message_timeout_s)
    measured = Ema(0.2)
    compute_s = own_compute_s(measured, base.progress)
    activation = spec_activation_bytes(spec)
    neighbours = Neighbours(me, stage, n_stages, dialer=base.transport, view=base.view, links=base.links,
                            routing=routing, liveness=base.liveness, announcer=membership, own_compute_s=compute_s,
                            activation_bytes=activation, timings=t)
    directory = SwarmDirectory(view=base.view, links=base.links, liveness=base.liveness, transport=base.transport,
                               own_compute_s=compute_s, activation_bytes=activation,
                               message_timeout_s=t.message_timeout_s)
    return _Flow(routing, neighbours, directory, compute_s, measured)


def _datapath(base: Base, part: StageExecutor | DataHolderExecutor, sampler: MicrobatchSampler | None,
              r: _Replicas, f: _Flow, joined: Joined, joiner: Joiner | None) -> Assembly:
    """Outbox, recovery, receive side, the role's path and its iterations; deaths reach the data path
    after the flow neighbours and before aggregation."""
    c, t, me, events = base.config, base.config.timings, base.identity.peer_id, base.events
    stage, n_stages, liveness, routing = base.identity.stage, base.spec.n_stages, base.liveness, f.routing
    other_hop = (relay_other_hop(stage, n_stages, routing, liveness.is_dead) if stage else
                 (lambda _meta, tried: routing.other_first_hop(tried)))
    outbox = Outbox(stage, n_stages, sender=base.sender, other_hop=other_hop,
                    round_trips=f.directory.round_trip_model, deadlines=base.deadlines, events=events,
                    clock=time.monotonic, retry_nobody_s=t.retry_nobody_s,
                    unproductive_probes=c.security.unproductive_probes)
    hops = HopTable()
    recovery = Recovery(me, outbox, network=f.directory, held_here=hops.held, deadlines=base.deadlines,
                        check_s=t.deadline_check_s)
    receiver = HopReceiver(stage, stage - 1 if stage else n_stages, hops, sender=base.sender, prober=liveness,
                           reporter=recovery, events=events)
    closing = Closing(gate=r.gate, view=base.view, transport=base.transport, aggregator=r.aggregator,
                      progress=base.progress, timings=t)
    clip = (GlobalClip(stage, n_stages, view=base.view, transport=base.transport, timings=t, clock=time.monotonic)
            if r.state.global_clip else None)
    checker = CrossCheck(me, fraction=c.security.cross_check_fraction, rng=random.Random(f"check:{me}"),
                         replicas=lambda: [p for p in base.view.online(1) if not liveness.is_dead(p)],
                         sender=base.sender, compute=base.compute, executor=None if stage == 0 else part,
                         exclude=liveness.exclude, events=events, timeout_s=t.message_timeout_s, reach=r.gate.reach,
                         part_iteration=lambda: r.state.iteration)
    path, role = _role(base, part, sampler, r, f, hops=hops, receiver=receiver, outbox=outbox, recovery=recovery,
                       closing=closing, clip=clip, checker=checker)
    redo = LostWork(me, stage, n_stages, inputs_to=outbox.next_stage, grads_to=receiver.grad_stage, outbox=outbox,
                    hops=hops, executor=part if isinstance(part, StageExecutor) else None, state=r.state,
                    sender=base.sender, transport=base.transport, view=base.view, is_dead=liveness.is_dead,
                    compute=base.compute, swarm_microbatches=closing.microbatches, events=events, timings=t,
                    clock=time.monotonic, counted_holders=closing.data_holders)
    liveness.subscribe(path.peer_dead)
    liveness.subscribe(lambda peer: r.aggregator.peer_dead(peer, "liveness probe"))
    checkpoints = CheckpointWriter(c.storage.checkpoint_dir, base.identity.run_id, stage, c.storage.checkpoint_every)
    metrics = _metrics(base, r, f, path, joined) if base.metrics is not None else None
    steps = r.aggregator if metrics is None else metrics.timed(r.aggregator)
    watch = SwarmWatch(stage, n_stages, view=base.view, progress=base.progress, events=events,
                       iteration=lambda: r.gate.iteration, timings=t)
    report = SelfReport(base.identity, base.progress, links=base.links, routing=routing,
                        neighbour_stages=neighbour_stages(stage, n_stages), weight_hash=lambda: r.state.last_hash,
                        iteration=lambda: r.gate.iteration, compute_s=f.compute_s, peers=lambda: len(base.view.records),
                        counters=path if isinstance(path, RelayPath) else None,
                        excluded=lambda: [(e.peer, e.reason) for e in liveness.exclusions.current()])
    outage = _outage(base)
    resync = (Resync(me, stage, view=base.view, own_hashes=report.hashes.history, cut_off=outage, joiner=joiner,
                     members=r.members, aggregator=r.aggregator, state=r.state, gate=r.gate, compute=base.compute,
                     progress=base.progress, events=events) if stage and joiner is not None else None)
    driver = IterationDriver(role, gate=r.gate, aggregator=steps, state=r.state, compute=base.compute,
                             checkpoints=checkpoints, events=events, stage=stage, resync=resync,
                             redo=redo if stage else None)
    server = StateServer(stage, r.state, compute=base.compute, gate=r.gate, events=events,
                         state_wait_s=t.state_wait_s)
    spec = base.spec
    shape = Shape(spec.microbatch_size, spec.seq_len, part.module.config.hidden_size, part.grad_dtype,
                  spec.microbatches_per_dh)
    guard = Guard(me, stage, n_stages, shape, peers=r.peers, kept=outbox, prober=liveness, view=base.view,
                  iteration=lambda: r.gate.iteration, refresh_s=t.heartbeat_s,
                  silent_after_s=t.aggregation_timeout_s / 2)
    receivers = Receivers(data=path, aggregator=r.aggregator, routing=routing, view=base.view,
                          membership=r.membership, closing=closing, recovery=recovery, state=server, clip=clip,
                          guard=guard, checker=checker, redo=redo)
    return Assembly(r.gate, r.members, r.membership, r.state, r.aggregator, routing, f.neighbours, path, outbox,
                    recovery, receiver, driver, watch, report, receivers, clip, metrics, outage, checker, redo)


def _outage(base: Base) -> OutageWatch:
    """The outage watch: news of the swarm are a peer's answer or a newer record of one."""
    view, liveness = base.view, base.liveness
    return OutageWatch(dht=view.dht, dialer=base.transport, initial_peers=base.config.network.initial_peers,
                       records=lambda: list(view.records.values()),
                       last_news=lambda: max(view.news_at, liveness.answer_at), poke=view.poke,
                       progress=base.progress, events=base.events, timings=base.config.timings)


def _metrics(base: Base, r: _Replicas, f: _Flow, path: RelayPath | HolderPath, joined: Joined) -> NodeMetrics:
    """The node's metrics over its components; they hear its events from now on."""
    metrics = NodeMetrics(base.identity, base.progress, gate=r.gate,
                          work=path if isinstance(path, RelayPath) else None, routing=f.routing, links=base.links,
                          neighbour_stages=neighbour_stages(base.identity.stage, base.spec.n_stages),
                          sent=base.sender, received=base.traffic, compute=base.compute, joined=joined,
                          clock=time.monotonic)
    base.events.listen(metrics.observe)
    return metrics


def _role(base: Base, part: StageExecutor | DataHolderExecutor, sampler: MicrobatchSampler | None, r: _Replicas,
          f: _Flow, *, hops: HopTable, receiver: HopReceiver, outbox: Outbox, recovery: Recovery,
          closing: Closing, clip: GlobalClip | None,
          checker: CrossCheck) -> tuple[RelayPath | HolderPath, IterationRole]:
    """A relay's path and role, or a data holder's (it has a sampler)."""
    t, me, events, view = base.config.timings, base.identity.peer_id, base.events, base.view
    if sampler is None:
        path = RelayPath(me, base.identity.stage, base.spec.n_stages, part, hops=hops, receiver=receiver,
                         outbox=outbox, recovery=recovery, compute=base.compute, routing=f.routing, gate=r.gate,
                         is_dead=base.liveness.is_dead, events=events, compute_s=f.measured,
                         wait_for_step_s=t.wait_for_step_s)
        return path, RelayRole(path, closing=closing, clip=clip, gate=r.gate, events=events,
                               poll_s=t.closed_poll_s)
    holder = HolderPath(me, part, sampler, tails=hops, receiver=receiver, outbox=outbox, recovery=recovery,
                        compute=base.compute, events=events, compute_s=f.measured, checker=checker)
    return holder, HolderRole(holder, spec=base.spec, routing=f.routing, recovery=recovery, closing=closing, clip=clip,
                              online_nodes=lambda: 1 + sum(rec.state == "online" for rec in view.records.values()),
                              data=base.config.data, events=events, report_every_s=t.report_every_s)
