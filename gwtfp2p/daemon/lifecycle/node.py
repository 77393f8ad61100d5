"""A node's life: DHT → run spec → transport → stage → part → join → components → serve → leave → stop.

``run_node(config, events, stop)`` is what ``gwtf join`` runs on its uvloop. ``start`` builds the node
in order, registering each resource's shutdown on an exit stack as it is made (so a failed start
undoes only what exists): the DHT first (it forks), the ``--metrics-port`` endpoint, the transport on
the DHT's libp2p daemon (its inbox behind a byte counter), the view, the failure detector and the
sender; then the stage, the part on the one compute thread, its state (the join) and the serving
components (``assembly``). Each start-up phase done is a ``startup`` event. ``Node.serve`` runs the loops until
``stop``, then leaves gracefully; the exit stack shuts everything down in reverse order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prometheus_client import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from gwtfp2p.daemon.aggregation.answers import AnswerBox
from gwtfp2p.daemon.aggregation.joining import Joiner
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.config import NodeConfig
from gwtfp2p.daemon.datapath.relay import RelayPath
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.lifecycle.assembly import Assembly, Base, assemble
from gwtfp2p.daemon.lifecycle.inbox import Inbox
from gwtfp2p.daemon.lifecycle.leaving import Leave, leave
from gwtfp2p.daemon.lifecycle.metrics import StartupMetrics
from gwtfp2p.daemon.lifecycle.metrics_http import MetricsEndpoint
from gwtfp2p.daemon.lifecycle.network import open_network
from gwtfp2p.daemon.lifecycle.parts import build_part, estimate_compute_s, load_sampler
from gwtfp2p.daemon.lifecycle.preflight import PROTOCOL_VERSIONS
from gwtfp2p.daemon.lifecycle.run_spec import resolve_run_spec
from gwtfp2p.daemon.lifecycle.self_report import Identity, joining_record
from gwtfp2p.daemon.lifecycle.shutdown_watch import ShutdownWatch
from gwtfp2p.daemon.lifecycle.traffic import CountedHandlers
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.swarm.admitted import AdmittedPeers
from gwtfp2p.daemon.swarm.exclusions import Exclusions
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.liveness import Liveness
from gwtfp2p.daemon.swarm.placing import pick_stage
from gwtfp2p.daemon.swarm.redial import RecordDialer
from gwtfp2p.daemon.swarm.sending import Sender
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.swarm.watch import first_useful
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.testing import netns, testpoints
from gwtfp2p.daemon.timeouts import Deadlines
from gwtfp2p.dht import DHTError, run_id_of
from gwtfp2p.transport import LinkEmulator, Transport
from gwtfp2p.transport.compression import WireCodecs

logger = logging.getLogger(__name__)
STARTUP_PHASES = ("dht", "run spec", "transport", "stage", "model", "data", "join")  # ``startup`` events


class Node:
    """A started node: its base (network, view, failure detector), its part's join and its components."""

    def __init__(self, base: Base, parts: Assembly, joiner: Joiner, stage_reason: str) -> None:
        self.base = base
        self.parts = parts
        self.joiner = joiner
        self.stage_reason = stage_reason
        self.background = Background("node")

    def ready_fields(self) -> dict:
        """The ``ready`` event: who this node is, what it serves, where its state came from."""
        c, identity, joiner = self.base.config, self.base.identity, self.joiner
        return dict(peer_id=identity.peer_id, maddrs=list(identity.maddrs), role=c.role, stage=identity.stage,
                    stage_reason=self.stage_reason, run_id=identity.run_id, shard=c.data.shard,
                    n_shards=c.data.n_shards, from_iteration=self.parts.gate.iteration, location=c.network.location,
                    pid_started_at=self.base.progress.started_at, state_source=joiner.source,
                    state_bytes=joiner.state_bytes, download_s=round(joiner.download_s, 4),
                    state_iteration=joiner.state_iteration, replayed_steps=joiner.replayed_steps,
                    metrics_port=None if self.base.metrics is None else self.base.metrics.port)

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until ``stop``, then leave gracefully."""
        base, parts, bg = self.base, self.parts, self.background
        base.progress.state = "online"
        try:
            await base.view.publish(parts.report.record())
        except DHTError as e:
            logger.warning("publishing this node's record failed (the heartbeat retries): %s", e)
        base.view.follow(parts.neighbours)
        loops_stop, abort = asyncio.Event(), asyncio.Event()
        bg.spawn(base.view.run(loops_stop, parts.report.record), "dht heartbeat")
        bg.spawn(parts.routing.run(loops_stop), "flow ticks")
        bg.spawn(parts.neighbours.probe_loop(loops_stop), "rtt probes")
        bg.spawn(parts.recovery.run(loops_stop), "recovery deadlines")
        bg.spawn(self._progress_loop(loops_stop), "progress")
        bg.spawn(parts.watch.run(loops_stop), "stage watch")
        if parts.outage is not None:
            bg.spawn(parts.outage.run(loops_stop), "outage watch")
        work = bg.spawn(parts.driver.run(stop, abort), "iterations")
        if isinstance(parts.path, RelayPath):
            path = parts.path
            bg.spawn(first_useful(loops_stop, lambda: path.backwards, lambda: parts.gate.iteration, base.progress,
                                  base.events, base.config.timings.first_useful_poll_s), "first useful microbatch")
        await stop.wait()
        await leave(self._leave(), parts.aggregator.active, work, abort)
        loops_stop.set()

    def _leave(self) -> Leave:
        base, parts = self.base, self.parts

        async def publish() -> None:
            await base.view.publish(parts.report.record())

        return Leave(self_id=base.identity.peer_id, progress=base.progress, events=base.events, gate=parts.gate,
                     members=parts.members, set_capacity=parts.routing.set_capacity,
                     held_until=parts.path.last_iteration, refuse_after=parts.path.refuse_after,
                     announce=parts.membership.announce, publish=publish, grace_s=base.config.timings.grace_s)

    async def _progress_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.base.config.timings.heartbeat_s)
            except asyncio.TimeoutError:
                self.base.events.emit("progress", **self.parts.report.progress_fields(),
                                      traffic=self.base.sender.traffic.fields())

    def stop_serving(self) -> list:
        """What to close, in order, when the node stops (its loops first)."""
        p = self.parts
        clip = [] if p.clip is None else [p.clip]
        extra = [c for c in (p.checker, p.redo) if c is not None]
        return [self.background, p.driver, *clip, p.path, *extra, p.receiver, p.recovery, p.aggregator,
                p.neighbours, p.routing]


async def start(config: NodeConfig, events: Events, stack: contextlib.AsyncExitStack) -> Node:
    """Build a node in order; each resource's shutdown goes on ``stack`` as soon as it exists."""
    c, t = config, config.timings
    progress = NodeProgress(started_at=time.time())
    link = LinkEmulator(c.network.location, c.network.location_scale) if c.network.location else None  # checks it
    testpoints.install()  # tests and the chaos harness only ($GWTF_CRASH_AT, $GWTF_DELAY_AT, $GWTF_CRASH_FILE)
    netns.enter_from_env()  # tests only: $GWTF_NETNS, before any socket or thread
    compute = ComputeThread(c.torch_threads)
    stack.callback(compute.shutdown)
    net = c.network
    network = await open_network(c, events, stack)  # identity key, reachability, the DHT, peers' versions
    dht = network.dht
    metrics = await _metrics_endpoint(c, progress, events, stack)  # after the DHT's fork: it keeps no socket
    _phase("dht", progress, events)
    spec = await resolve_run_spec(dht, c)
    _phase("run spec", progress, events)
    answers = AnswerBox()
    inbox = Inbox(answers, WireCodecs.of(spec))
    traffic = CountedHandlers(inbox)
    transport = await Transport.start(await dht.replicate_p2p(), traffic, link=link, versions=PROTOCOL_VERSIONS)
    stack.push_async_callback(transport.close)
    stack.push_async_callback(inbox.close)
    maddrs = network.record_maddrs(await transport.visible_maddrs())
    admitted = AdmittedPeers(dht.peer_id, run_id_of(spec), creator=c.security.permissioned_by,
                             admit_path=c.security.admit_path)
    view = SwarmView(dht, run_id_of(spec), t.heartbeat_s, admitted=admitted)
    await view.refresh()
    _phase("transport", progress, events)
    links, deadlines = LinkTable(net.default_bandwidth_bytes_per_s), Deadlines(t)
    liveness = Liveness(dht.peer_id, transport, links, deadlines, t,
                        exclusions=Exclusions(c.security.exclude_s, time.monotonic),
                        redialer=RecordDialer(view, transport))
    stack.push_async_callback(liveness.close)
    sender = Sender(transport, links, deadlines, t, on_failure=liveness.suspect, codecs=WireCodecs.of(spec))
    stage, reason = 0, "data holder"
    if not c.is_data_holder:
        stage, reason = await pick_stage(c.stage, spec, dht.peer_id, view=view, liveness=liveness, links=links,
                                         capacity=c.relay_capacity,
                                         default_bandwidth_bytes_per_s=net.default_bandwidth_bytes_per_s)
    identity = Identity(run_id_of(spec), dht.peer_id, c.role, stage,
                        spec.microbatches_per_dh if c.is_data_holder else c.relay_capacity, maddrs,
                        link.own_location if link is not None else "")
    base = Base(c, events, progress, compute, transport, view, links, liveness, sender, deadlines, spec, identity,
                traffic, metrics)
    return await _join(base, answers, inbox, reason, stack)


async def _join(base: Base, answers: AnswerBox, inbox: Inbox, reason: str, stack: contextlib.AsyncExitStack) -> Node:
    """The stage is chosen: announce it (joining), build and load the part, join its replicas, assemble."""
    c, spec, progress, stage = base.config, base.spec, base.progress, base.identity.stage
    joining_stop = asyncio.Event()
    heartbeat = asyncio.create_task(base.view.run(joining_stop, lambda: joining_record(base.identity, progress)))
    try:
        base.events.emit("placed", peer_id=base.identity.peer_id, stage=stage, reason=reason)
        logger.info("%s at stage %d (%s)", base.identity.peer_id, stage, reason)  # logs name whose they are
        _phase("stage", progress, base.events)
        part = await base.compute.run(build_part, spec, stage, c.device)
        progress.prior_compute_s = await base.compute.run(estimate_compute_s, part, spec)
        _phase("model", progress, base.events)
        sampler = (await base.compute.run(load_sampler, spec, c.data.shard, c.data.n_shards)
                   if c.is_data_holder else None)
        _phase("data", progress, base.events)
        joiner = Joiner(base.identity.peer_id, stage, part, view=base.view, transport=base.transport,
                        compute=base.compute, answers=answers, events=base.events,
                        checkpoint_dir=c.storage.checkpoint_dir, timings=c.timings,
                        verify_states=c.security.signatures)
        from_iteration = await joiner.join()
        _phase("join", progress, base.events)
    finally:
        joining_stop.set()
        heartbeat.cancel()
    node = Node(base, assemble(base, part, sampler, from_iteration, joiner.accepted, joiner, joiner), joiner, reason)
    base.events.listen(node.parts.report.hashes.on_event)  # the record's recent_hashes: every step's hash
    if base.metrics is not None and node.parts.metrics is not None:
        base.metrics.registry.register(node.parts.metrics)
    for component in reversed(node.stop_serving()):
        stack.push_async_callback(component.close)
    inbox.serve(node.parts.receivers)
    return node


def _phase(name: str, progress: NodeProgress, events: Events) -> None:
    """A start-up phase is done: logged, and a ``startup`` event (the live screen's progress bar)."""
    seconds = time.time() - progress.started_at
    logger.info("startup: %s done after %.2f s", name, seconds)
    step = STARTUP_PHASES.index(name) + 1
    events.emit("startup", phase=name, step=step, steps=len(STARTUP_PHASES), seconds=round(seconds, 3),
                next_phase=STARTUP_PHASES[step] if step < len(STARTUP_PHASES) else "")


async def _metrics_endpoint(config: NodeConfig, progress: NodeProgress, events: Events,
                            stack: contextlib.AsyncExitStack) -> MetricsEndpoint | None:
    """``--metrics-port``: the endpoint, with the process's and the start-up's figures until the node serves."""
    if config.network.metrics_port is None:
        return None
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    startup = StartupMetrics(progress)
    registry.register(startup)
    events.listen(startup.observe)
    endpoint = await MetricsEndpoint.start(config.network.host, config.network.metrics_port, registry)
    stack.push_async_callback(endpoint.close)
    return endpoint


def _quiet_shutdown_noise(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """hivemind's P2P client leaves a reader task that fails with a reset connection when p2pd stops;
    that is expected at shutdown and only logged at debug level. Everything else as usual."""
    if isinstance(context.get("exception"), (ConnectionResetError, BrokenPipeError)):
        logger.debug("ignored at shutdown: %s", context.get("message"))
        return
    loop.default_exception_handler(context)


async def run_node(config: NodeConfig, events: Events, stop: asyncio.Event) -> None:
    """Start a node, serve until ``stop``, leave and shut down (also on errors)."""
    asyncio.get_running_loop().set_exception_handler(_quiet_shutdown_noise)
    node: Node | None = None
    watch = ShutdownWatch(config.timings.grace_s + config.timings.shutdown_s)
    watching = asyncio.create_task(watch.arm_on(stop), name="shutdown watch")
    try:
        async with contextlib.AsyncExitStack() as stack:
            node = await start(config, events, stack)
            node.base.progress.ready_at = time.time()
            events.emit("ready", **node.ready_fields())
            await node.serve(stop)
    finally:
        watching.cancel()
        watch.disarm()
        if node is not None:  # it started: say when everything is shut down
            events.emit("stopped", iteration=node.parts.gate.iteration)
