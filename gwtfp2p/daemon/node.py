"""A node's life: DHT → run spec → P2P transport → stage → model part → state → serve → leave.

``run_node(config, events, stop)`` is what ``gwtf join`` runs on its uvloop. The DHT is created
first (it forks), then the transport on the DHT's libp2p daemon, then the part on the one compute
thread. Serving runs the DHT heartbeat, the flow ticks, RTT probes and either the data holder's
iteration driver or the relay's aggregation loop, until ``stop``; then the node leaves gracefully
(announce, stop taking flow, finish the current iteration within ``grace_s``) and shuts down.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING

from gwtfp2p.config import FlowParams, NodeConfig, RunSpec
from gwtfp2p.daemon import testpoints
from gwtfp2p.daemon.aggregation import Aggregator
from gwtfp2p.daemon.checkpoint import CheckpointWriter
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.control import Closed, encode_control
from gwtfp2p.daemon.data_holder import DataHolder
from gwtfp2p.daemon.datapath import RelayDataPath
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.gate import IterationGate
from gwtfp2p.daemon.handlers import NodeHandlers
from gwtfp2p.daemon.joining import Joiner
from gwtfp2p.daemon.leaving import leave
from gwtfp2p.daemon.links import LinkTable
from gwtfp2p.daemon.members import MemberTable
from gwtfp2p.daemon.membership import SwarmView
from gwtfp2p.daemon.parts import build_part, estimate_compute_s, load_sampler
from gwtfp2p.daemon.peers import PeerManager
from gwtfp2p.daemon.placing import pick_stage
from gwtfp2p.daemon.records import own_record, progress_fields
from gwtfp2p.daemon.routing import FlowDriver
from gwtfp2p.daemon.sending import Sender
from gwtfp2p.daemon.spec_source import resolve_run_spec
from gwtfp2p.daemon.swarm_instance import spec_activation_bytes
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.watch import SwarmWatch
from gwtfp2p.dht import DHTError, SwarmDHT, run_id_of
from gwtfp2p.flow.node import FlowNode
from gwtfp2p.transport import LinkEmulator, Transport, TransportError

if TYPE_CHECKING:
    from gwtfp2p.model.data import MicrobatchSampler

logger = logging.getLogger(__name__)
STEP_POLL_S = 0.5


class Node:
    """One daemon's components; built by ``start``, torn down by ``shutdown``."""

    def __init__(self, config: NodeConfig, events: Events) -> None:
        self.config = config
        self.events = events
        self.started_at = time.time()
        self.state = "joining"
        self.background = Background("node")
        self.dht: SwarmDHT | None = None
        self.transport: Transport | None = None
        self.view: SwarmView | None = None
        self.compute = ComputeThread(config.torch_threads)
        self.links = LinkTable(config.default_bandwidth_bytes_per_s)
        self.spec: RunSpec | None = None
        self.run_id = ""
        self.stage = 0
        self.part = None
        self.gate = IterationGate(0)
        self.members: MemberTable | None = None
        self.aggregator: Aggregator | None = None
        self.routing: FlowDriver | None = None
        self.peers: PeerManager | None = None
        self.joiner: Joiner | None = None
        self.data: RelayDataPath | DataHolder | None = None
        self.sender: Sender | None = None
        self.maddrs: list[str] = []
        self.prior_compute_s = 0.0
        self.state_hash = ""
        self.loss: float | None = None
        self.tokens_per_s = 0.0
        self.loops_stop = asyncio.Event()
        self.watch = SwarmWatch(self)
        self.checkpoints: CheckpointWriter | None = None
        self.ready_at = 0.0

    @property
    def peer_id(self) -> str:
        return self.dht.peer_id if self.dht is not None else ""

    # -- start -----------------------------------------------------------------------------------
    async def start(self) -> None:
        c = self.config
        link = LinkEmulator(c.location, c.location_scale) if c.location else None  # checks --location first
        testpoints.install_crash_rearm()  # tests and the chaos harness only ($GWTF_CRASH_FILE)
        self.dht = await SwarmDHT.create(initial_peers=c.initial_peers, host_maddrs=c.host_maddrs,
                                         announce_maddrs=c.announce_maddrs, identity_path=c.identity_path or None,
                                         startup_timeout_s=c.startup_timeout_s)
        self._phase("dht")
        self.spec = await resolve_run_spec(self.dht, c)
        self._phase("run spec")
        self.run_id = run_id_of(self.spec)
        self.transport = await Transport.start(await self.dht.replicate_p2p(), NodeHandlers(self), link=link)
        self.maddrs = (await self.transport.visible_maddrs())[:6]
        self.view = SwarmView(self.dht, self.run_id, c.heartbeat_s)
        await self.view.refresh()
        self._phase("transport")
        self.sender = Sender(self.transport, self.links)
        self.stage, reason = 0, "data holder"
        if not c.is_data_holder:
            self.stage, reason = await pick_stage(self, c.stage)
        self.background.spawn(self.view.run(self.loops_stop, lambda: own_record(self)), "dht heartbeat")
        self.events.emit("placed", peer_id=self.peer_id, stage=self.stage, reason=reason)
        self._phase("stage")
        self.part = await self.compute.run(build_part, self.spec, self.stage, c.device)
        self.prior_compute_s = await self.compute.run(estimate_compute_s, self.part, self.spec)
        self._phase("model")
        sampler = await self.compute.run(load_sampler, self.spec, c.shard, c.n_shards) if c.is_data_holder else None
        self._phase("data")
        await self._join_part()
        self._phase("join")
        self._build_components(sampler)
        self.ready_at = time.time()
        joined = self.joiner
        assert joined is not None
        self.events.emit("ready", peer_id=self.peer_id, maddrs=self.maddrs, role=c.role, stage=self.stage,
                         stage_reason=reason, run_id=self.run_id, shard=c.shard, n_shards=c.n_shards,
                         from_iteration=self.gate.iteration, location=c.location, pid_started_at=self.started_at,
                         state_source=joined.source, state_bytes=joined.state_bytes,
                         download_s=round(joined.download_s, 4), state_iteration=joined.state_iteration,
                         replayed_steps=joined.replayed_steps)

    def _phase(self, name: str) -> None:
        logger.info("startup: %s done after %.2f s", name, time.time() - self.started_at)

    async def _join_part(self) -> None:
        assert self.view is not None and self.transport is not None
        self.joiner = Joiner(self.peer_id, self.stage, self.part, self.view, self.transport, self.compute,
                             self.events, self.config.checkpoint_dir)
        from_iteration = await self.joiner.join()
        self.gate = IterationGate(from_iteration)
        self.members = MemberTable(self.peer_id, from_iteration)
        for peer in self.joiner.accepted:  # they took us from from_iteration: expect them, whatever the DHT says
            self.members.add(peer, from_iteration)

    def _build_components(self, sampler: MicrobatchSampler | None) -> None:
        c, spec = self.config, self.spec
        assert spec is not None and self.transport is not None and self.view is not None
        assert self.sender is not None and self.members is not None
        self.aggregator = Aggregator(self.peer_id, self.stage, self.members, self.part, self.compute, self.sender,
                                     events=self.events, replay_steps=c.replay_steps)
        self.aggregator.online_peers = self._online_same_stage
        self.aggregator.listed = lambda peer: peer in self.view.records
        self.checkpoints = CheckpointWriter(c.checkpoint_dir, self.run_id, self.stage, c.checkpoint_every)
        params = FlowParams(tick_s=c.tick_s)
        capacity = 0 if c.is_data_holder else c.relay_capacity
        flow = FlowNode(self.peer_id, self.stage, spec.n_stages, capacity=capacity,
                        supply=spec.microbatches_per_dh if c.is_data_holder else 0, params=params,
                        rng=random.Random(f"{spec.seed}:{self.peer_id}"))
        self.routing = FlowDriver(flow, spec.n_stages, self.transport, c.tick_s, on_unreachable=self._unreachable)
        self.peers = PeerManager(self.peer_id, self.stage, spec.n_stages, self.transport, self.view, self.links,
                                 self.routing, self.members, self.compute_s, spec_activation_bytes(spec),
                                 probe_s=max(1.0, 4 * c.tick_s))
        if sampler is not None:
            self.data = DataHolder(self.peer_id, spec, self.part, sampler, self.compute, self.sender, self.routing,
                                   self.gate, self.aggregator, self.events, self.broadcast_closed)
            self.data.min_nodes = c.min_nodes
            self.data.online_nodes = lambda: 1 + sum(r.state == "online" for r in self.view.records.values())
        else:
            self.data = RelayDataPath(self.peer_id, self.stage, spec.n_stages, self.part, self.compute, self.sender,
                                      self.routing, self.gate)
        self.data.attach(self.peers, self.events)  # crash recovery: liveness, probes, resends
        self.peers.on_dead.append(lambda peer: self.aggregator.peer_dead(peer, "liveness probe"))
        self.aggregator.probe = self.peers.alive  # one failure detector for the node

    def _online_same_stage(self) -> list[str]:
        assert self.view is not None
        return [r.peer_id for r in self.view.by_stage(self.stage) if r.state == "online"]

    def _unreachable(self, peer: str) -> None:
        if self.peers is not None:
            self.peers.lost(peer)

    def compute_s(self) -> float:
        measured = self.data.compute_s.value if self.data is not None else None
        return measured if measured is not None else self.prior_compute_s

    # -- serve -----------------------------------------------------------------------------------
    async def serve(self, stop: asyncio.Event) -> None:
        """Run until ``stop``, then leave gracefully."""
        assert self.view is not None and self.routing is not None and self.peers is not None
        self.state = "online"
        try:
            await self.view.publish(own_record(self))
        except DHTError as e:
            logger.warning("publishing this node's record failed (the heartbeat retries): %s", e)
        self.view.listener = self.peers
        self.peers.announce = True
        for record in list(self.view.records.values()):
            self.peers.peer_joined(record)
        loops_stop = self.loops_stop
        bg = self.background
        bg.spawn(self.routing.run(loops_stop), "flow ticks")
        bg.spawn(self.peers.probe_loop(loops_stop), "rtt probes")
        bg.spawn(self._progress_loop(loops_stop), "progress")
        bg.spawn(self.watch.run(loops_stop), "stage watch")
        abort = asyncio.Event()
        if isinstance(self.data, DataHolder):
            work = bg.spawn(self.data.run(stop, abort, self.config.max_iterations), "iterations")
        else:
            work = bg.spawn(self._relay_steps(abort), "aggregation steps")
            bg.spawn(self.watch.first_useful(loops_stop, self.ready_at), "first useful microbatch")
        await stop.wait()
        await leave(self, work, abort)
        loops_stop.set()

    async def _relay_steps(self, abort: asyncio.Event) -> None:
        assert self.aggregator is not None and isinstance(self.data, RelayDataPath)
        while not abort.is_set():
            t = self.gate.iteration
            if not (await self.gate.wait_closed(t, STEP_POLL_S) or self._closed_elsewhere(t)):
                continue
            await self.gate.begin_step()
            try:
                outcome = await self.aggregator.aggregate(t)
            finally:
                self.data.end_iteration(t)
                await self.gate.advance(t + 1)
            self.state_hash = outcome.step.state_hash
            self.events.emit("step", stage=self.stage, iteration=t, hash=outcome.step.state_hash,
                             count=outcome.step.count, members=list(outcome.members),
                             own_count=self.data.backwards, agreement=outcome.how, dropped=list(outcome.dropped),
                             seconds=round(outcome.seconds, 4))
            await self._checkpoint(t + 1)

    async def _checkpoint(self, steps: int) -> None:
        """Write the stage's state after ``steps`` steps to --checkpoint-dir if due (in a thread)."""
        writer = self.checkpoints
        if writer is None or self.aggregator is None or not writer.due(steps):
            return
        iteration, data = await self.compute.run(self.aggregator.state)
        state_hash = self.state_hash

        async def save() -> None:
            started = time.monotonic()
            path = await asyncio.to_thread(writer.save, iteration, state_hash, data)
            self.events.emit("checkpoint", stage=self.stage, iteration=iteration, hash=state_hash, bytes=len(data),
                             seconds=round(time.monotonic() - started, 4), path=str(path))

        self.background.spawn(save(), f"checkpoint {iteration}")

    def _closed_elsewhere(self, t: int) -> bool:
        """Iteration t is closed if a same-stage replica already sent its contribution for it, or
        every live data holder's record is past it (a lost ``Closed`` message)."""
        assert self.aggregator is not None and self.view is not None
        holders = self.view.by_stage(0)
        return self.aggregator.seen_iteration(t) or (bool(holders) and all(r.iteration > t for r in holders))

    async def on_closed(self, closed: Closed) -> None:
        self.loss, self.tokens_per_s = closed.loss, closed.tokens_per_s
        await self.gate.close(closed.iteration)

    async def broadcast_closed(self, closed: Closed) -> None:
        """A data holder tells every relay that ``closed.iteration`` is over."""
        assert self.view is not None and self.transport is not None
        self.loss, self.tokens_per_s = closed.loss, closed.tokens_per_s
        payload = encode_control(closed)
        relays = [p for p, r in self.view.records.items() if r.role == "relay"]
        await asyncio.gather(*(self._send_control(p, payload) for p in relays))

    async def _send_control(self, peer: str, payload: bytes) -> None:
        assert self.transport is not None
        for delay in (0.2, 1.0, None):
            try:
                await self.transport.send_flow(peer, payload, timeout_s=5.0)
                return
            except TransportError as e:
                if delay is None:
                    logger.warning("control message to %s lost: %s", peer, e)
                    return
                await asyncio.sleep(delay)

    async def _progress_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.config.heartbeat_s)
            except asyncio.TimeoutError:
                self.events.emit("progress", **progress_fields(self))

    # -- shut down ---------------------------------------------------------------------------
    async def shutdown(self) -> None:
        await self.background.close()
        for component in (self.data, self.aggregator, self.peers, self.routing):
            if component is not None:
                await component.close()
        if self.transport is not None:
            await self.transport.close()
        if self.dht is not None:
            await self.dht.shutdown()
        self.compute.shutdown()
        if self.state != "joining":
            self.events.emit("stopped", iteration=self.gate.iteration)


def _quiet_shutdown_noise(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """hivemind's P2P client leaves a reader task that fails with a reset connection when p2pd stops;
    that is expected at shutdown and only logged at debug level. Everything else as usual."""
    if isinstance(context.get("exception"), (ConnectionResetError, BrokenPipeError)):
        logger.debug("ignored at shutdown: %s", context.get("message"))
        return
    loop.default_exception_handler(context)


async def run_node(config: NodeConfig, events: Events, stop: asyncio.Event) -> None:
    """Start a node, serve until ``stop`` is set, leave and shut down (also on errors)."""
    asyncio.get_running_loop().set_exception_handler(_quiet_shutdown_noise)
    node = Node(config, events)
    try:
        await node.start()
        await node.serve(stop)
    finally:
        await node.shutdown()
