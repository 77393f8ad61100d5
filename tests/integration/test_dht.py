"""SwarmDHT over real hivemind DHT processes on 127.0.0.1: run spec and node records (publish, read,
expire, leave, garbage dropped), clear start errors, transport over the DHT's p2p, no orphans."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time

import psutil
import pytest
import torch
from hivemind.utils import get_dht_time

from gwtfp2p.config import RunSpec
from gwtfp2p.dht import (
    BootstrapError,
    DHTClosed,
    DHTStartError,
    NodeRecord,
    RunSpecRecord,
    SwarmDHT,
    encode_record,
    nodes_key,
)
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta, Transport
from tests.integration.conftest import run_async

pytestmark = pytest.mark.timeout(90)
SPEC = RunSpec(n_stages=2, seed=11)
RUN_ID = RunSpecRecord.from_spec(SPEC).run_id


@contextlib.asynccontextmanager
async def two_nodes():
    first = await SwarmDHT.create()
    try:
        second = await SwarmDHT.create(initial_peers=await first.visible_maddrs())
        try:
            yield first, second
        finally:
            await second.shutdown()
    finally:
        await first.shutdown()


def relay(peer_id: str, **fields) -> NodeRecord:
    return NodeRecord(run_id=RUN_ID, peer_id=peer_id, role="relay", stage=1, state="online", **fields)


async def poll(read, predicate, timeout_s: float = 10.0, period_s: float = 0.1):
    """Re-read until ``predicate(value)`` holds or the deadline passes (returns the last value)."""
    deadline = time.monotonic() + timeout_s
    value = await read()
    while not predicate(value) and time.monotonic() < deadline:
        await asyncio.sleep(period_s)
        value = await read()
    return value


def test_run_spec_published_by_one_is_read_by_another():
    async def scenario():
        async with two_nodes() as (first, second):
            record = RunSpecRecord.from_spec(SPEC, published_by=first.peer_id)
            assert await first.publish_run_spec(record, ttl_s=60)
            current = await poll(second.read_current_run, lambda r: r is not None)
            by_id = await second.read_run_spec(RUN_ID)
            missing = await second.read_run_spec("f" * 16)
            return record, current, by_id, missing

    record, current, by_id, missing = run_async(scenario())
    assert current == record == by_id and current.to_spec() == SPEC and current.run_id == RUN_ID
    assert missing is None


def test_node_records_heartbeat_leave_and_expire():
    async def scenario():
        async with two_nodes() as (first, second):
            heartbeat_s = 0.5
            await second.publish_node(relay(second.peer_id, capacity=3, location="Tokyo"), heartbeat_s=heartbeat_s)
            await first.publish_node(NodeRecord(run_id=RUN_ID, peer_id=first.peer_id, role="data", stage=0,
                                                state="online"), heartbeat_s=30)
            seen = await poll(lambda: first.read_nodes(RUN_ID), lambda nodes: len(nodes) == 2)
            await second.publish_leaving(relay(second.peer_id), heartbeat_s=heartbeat_s)
            leaving = await poll(lambda: first.read_nodes(RUN_ID),
                                 lambda nodes: nodes.get(second.peer_id, relay(second.peer_id)).state == "leaving")
            expired = await poll(lambda: first.read_nodes(RUN_ID), lambda nodes: second.peer_id not in nodes)
            return first.peer_id, second.peer_id, seen, leaving, expired

    first_id, second_id, seen, leaving, expired = run_async(scenario())
    assert seen[second_id].capacity == 3 and seen[second_id].updated_at > 0 and seen[first_id].role == "data"
    assert leaving[second_id].state == "leaving"
    assert set(expired) == {first_id}


def test_invalid_and_spoofed_records_are_dropped():
    async def scenario():
        async with two_nodes() as (first, second):
            expiration = get_dht_time() + 30
            key = nodes_key(RUN_ID)
            await second.store(key, b"\x00garbage", expiration, subkey="junk")
            await second.store(key, b'{"version": 1, "run_id": "x"}', expiration, subkey="partial")
            await second.store(key, encode_record(relay(first.peer_id)), expiration, subkey=second.peer_id)
            other_run = relay(second.peer_id).model_copy(update={"run_id": "a" * 16})
            await second.store(key, encode_record(other_run), expiration, subkey=second.peer_id + "x")
            await second.publish_node(relay(second.peer_id), heartbeat_s=30)
            return second.peer_id, await poll(lambda: first.read_nodes(RUN_ID), lambda nodes: len(nodes) >= 1)

    second_id, nodes = run_async(scenario())
    assert list(nodes) == [second_id]


def test_publish_node_refuses_a_record_of_another_peer():
    async def scenario():
        dht = await SwarmDHT.create()
        try:
            with pytest.raises(ValueError):
                await dht.publish_node(relay("12D3KooWAZrpVn1HLK8X78Wxjsb5xQXn8CKwmT5GF2jxrD8Pg9Wy"),
                                       heartbeat_s=1)
        finally:
            await dht.shutdown()
        with pytest.raises(DHTClosed):
            await dht.read_nodes(RUN_ID)

    run_async(scenario())


def test_start_errors_are_clear():
    async def scenario():
        dead = await SwarmDHT.create()
        dead_maddrs = await dead.visible_maddrs()
        await dead.shutdown()
        started = time.monotonic()
        with pytest.raises(BootstrapError, match="--initial-peers"):
            await SwarmDHT.create(initial_peers=dead_maddrs)
        bootstrap_s = time.monotonic() - started
        with pytest.raises(DHTStartError, match="--initial-peers"):
            await SwarmDHT.create(initial_peers=["not-a-multiaddr"])
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(DHTStartError, match="port"):
                await SwarmDHT.create(host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"])
        return bootstrap_s

    assert run_async(scenario()) < 15.0


class EchoAck:
    def __init__(self) -> None:
        self.received: asyncio.Queue = asyncio.Queue()

    async def on_forward(self, sender, meta, tensor):
        await self.received.put((sender, tensor))
        return Ack()

    async def on_backward(self, sender, meta, tensor):
        return Ack()

    async def on_flow_message(self, sender, payload):
        return None

    async def get_state(self, stage):
        return None


def test_transport_runs_over_the_dht_p2p():
    async def scenario():
        async with two_nodes() as (first, second):
            handlers = EchoAck()
            server = await Transport.start(await first.replicate_p2p(), handlers)
            client = await Transport.start(await second.replicate_p2p(), EchoAck())
            try:
                assert server.peer_id == first.peer_id and client.peer_id == second.peer_id
                rtt_s = (await client.ping(first.peer_id, timeout_s=5)).rtt_s
                meta = TransferMeta(microbatch=MicrobatchId(data_holder=client.peer_id, iteration=0, index=0), stage=1)
                tensor = torch.randn(3 * 2**20 // 4)
                await client.forward(first.peer_id, meta, tensor, timeout_s=10)
                sender, received = await asyncio.wait_for(handlers.received.get(), 10)
                return rtt_s, sender == second.peer_id and torch.equal(received, tensor)
            finally:
                await client.close()
                await server.close()

    rtt_s, exact = run_async(scenario())
    assert 0 < rtt_s < 1.0 and exact


def test_owner_killed_with_sigkill_leaves_no_orphans(spawn_peer):
    peer = spawn_peer("dht")
    owner = psutil.Process(peer.pid)
    descendants = owner.children(recursive=True)
    names = sorted(p.name() for p in descendants)
    assert any("p2pd" in name for name in names), names  # the DHT process and its p2pd
    os.kill(peer.pid, signal.SIGKILL)  # the owner only, not its group
    peer.popen.wait(timeout=10)
    _, alive = psutil.wait_procs(descendants, timeout=10)
    assert not alive, [p.name() for p in alive]
