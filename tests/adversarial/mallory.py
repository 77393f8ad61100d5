"""A hostile volunteer for the adversarial suite: ``python -m tests.adversarial.mallory MADDR``.

Mallory joins the swarm's DHT with a key of her own and serves RPCs, then takes JSON commands on stdin,
one per line, and answers each with one JSON line on stdout (the first line says she is ready). She uses
hivemind's own API and the project's RPC names and message formats, as a modified daemon would: forged
and garbage DHT records, control and agreement messages she is not entitled to send, a membership and
contributions of −N x the honest sum, a loss that overflows, malformed activations, backwards for
microbatches she never saw, idle bulk streams, a noised state under a high claimed iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
from typing import Any

import torch
from hivemind.utils import get_dht_time

from gwtfp2p.daemon.aggregation.admission import contribution_message, grad_digest
from gwtfp2p.daemon.lifecycle.parts import build_part
from gwtfp2p.daemon.swarm.peers import split_signature
from gwtfp2p.daemon.wire import CONTRIB, QUERY, VIEW, AggMessage, Closed, Member, encode_aggregation, encode_control
from gwtfp2p.dht import NodeRecord, RunSpecRecord, SwarmDHT, encode_record, nodes_key
from gwtfp2p.dht.identity import NodeKey
from gwtfp2p.dht.sealed import CURRENT_RUN_KEY
from gwtfp2p.model.fixedpoint import BOUND_LIMIT
from gwtfp2p.transport import Ack, MicrobatchId, StateBlob, TransferMeta, Transport, TransportError
from gwtfp2p.transport.servicer import TransportServicer

TIMEOUT_S = 10.0


class Handlers:
    """Mallory's RPC side: she acknowledges everything; as a poisoning member she answers the first honest
    contribution of each iteration with −factor times it; she serves a noised state if she has one."""

    def __init__(self) -> None:
        self.mallory: Mallory | None = None
        self.poison_factor = 0
        self.honest: tuple[torch.Tensor, int, int] | None = None  # the latest honest contribution: sum, count, bound
        self.iterations: set[int] = set()  # iterations honest members sent her something for
        self.wake = asyncio.Event()
        self.state: StateBlob | None = None
        self.answers: list[dict] = []

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        tags = meta.tags
        if tags.get("kind") == "grad" and tags.get("op", CONTRIB) == CONTRIB and tensor.dtype == torch.int64:
            self.honest = (tensor.reshape(-1).clone(), int(tags["count"]), int(tags.get("bound", 0)))
        if tags.get("kind") == "grad":
            self.iterations.add(meta.microbatch.iteration)
            self.wake.set()
        return Ack()

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        return Ack()

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        if payload[:1] == b"C":
            self.answers.append({"from": sender, **json.loads(payload[1:])})

    async def get_state(self, stage: int) -> StateBlob | None:
        return self.state if self.state is not None and self.state.stage == stage else None

    async def get_steps(self, stage: int, since_iteration: int) -> StateBlob | None:
        return None


class Mallory:
    def __init__(self, dht: SwarmDHT, transport: Transport, handlers: Handlers) -> None:
        self.dht, self.transport, self.handlers = dht, transport, handlers
        self.me = dht.peer_id
        self.record: NodeRecord | None = None
        self.heartbeat: asyncio.Task | None = None
        self.poisoner: asyncio.Task | None = None
        self.spec: Any = None
        self._numel: dict[int, int] = {}

    async def run(self) -> tuple[str, Any]:
        found = await self.dht.read_current_run()
        assert found is not None
        self.spec = found.to_spec()
        return found.run_id, self.spec

    async def nodes(self) -> dict[str, NodeRecord]:
        run_id, _ = await self.run()
        return await self.dht.read_nodes(run_id)

    async def raw_store(self, key: str, value: bytes, subkey: str | None, expiration: float) -> bool:
        """hivemind's own store, no seal: what a daemon without gwtf's signing sends."""
        future = self.dht._dht.store(key, value, expiration, subkey=subkey, return_future=True)
        return bool(await asyncio.wait_for(asyncio.wrap_future(future), TIMEOUT_S))

    # -- the DHT ------------------------------------------------------------------------------------------
    async def forge_records(self, victim: str, holder: str) -> dict[str, bool]:
        run_id, spec = await self.run()
        nodes, key, later = await self.nodes(), nodes_key(run_id), get_dht_time() + 3600
        leaving = nodes[victim].model_copy(update={"state": "leaving", "public_key": ""})
        huge = nodes[holder].model_copy(update={"iteration": 10**9, "public_key": ""})
        fake = NodeKey.generate().peer_id
        fake_relay = NodeRecord(run_id=run_id, peer_id=fake, role="relay", stage=1, state="online", capacity=10**6)
        other_run = RunSpecRecord.from_spec(spec.__class__(**{**spec.__dict__, "seed": spec.seed + 1}),
                                            published_by=self.me)
        stolen_run = RunSpecRecord.from_spec(spec.__class__(**{**spec.__dict__, "seed": spec.seed + 2}),
                                             published_by=holder)
        attempts = {
            "victim_leaving_sealed": self.dht.store(key, encode_record(leaving), later, subkey=victim),
            "victim_leaving_raw": self.raw_store(key, encode_record(leaving), victim, later),
            "holder_iteration_sealed": self.dht.store(key, encode_record(huge), later, subkey=holder),
            "holder_iteration_raw": self.raw_store(key, encode_record(huge), holder, later),
            "fake_relay_sealed": self.dht.store(key, encode_record(fake_relay), later, subkey=fake),
            "fake_relay_raw": self.raw_store(key, encode_record(fake_relay), fake, later),
            "node_list_plain_raw": self.raw_store(key, b"[]", None, later),
            "node_list_plain_sealed": self.dht.store(key, b"[]", later),
            "run_garbage_raw": self.raw_store(CURRENT_RUN_KEY, b"\x00garbage", None, later),
            "run_garbage_subkey_raw": self.raw_store(CURRENT_RUN_KEY, b"\x00garbage", self.me, later),
            "run_garbage_sealed": self.dht.store(CURRENT_RUN_KEY, b"\x00garbage", later, subkey=self.me),
            "run_stolen_sealed": self.dht.store(CURRENT_RUN_KEY, encode_record(stolen_run), later, subkey=holder),
            "run_plain_raw": self.raw_store(CURRENT_RUN_KEY, encode_record(other_run), None, later),
        }
        results = {name: await attempt for name, attempt in attempts.items()}
        # Her own run under her own subkey is hers to publish: it must not displace the swarm's.
        results["run_own_sealed"] = await self.dht.store(CURRENT_RUN_KEY, encode_record(other_run), later,
                                                         subkey=self.me)
        return results

    # -- becoming a member ----------------------------------------------------------------------------------
    async def become(self, role: str, stage: int, iteration: int = 0, capacity: int = 0,
                     weight_hash: str = "") -> str:
        run_id, _ = await self.run()
        self.record = NodeRecord(run_id=run_id, peer_id=self.me, role=role, stage=stage, state="online",
                                 capacity=capacity, iteration=iteration, weight_hash=weight_hash,
                                 maddrs=tuple((await self.transport.visible_maddrs())[:6]), compute_s=0.001)

        async def beat() -> None:
            while True:
                await self.dht.publish_node(self.record.model_copy(update={"updated_at": 0.0}), heartbeat_s=2.0)
                await asyncio.sleep(1.0)

        if self.heartbeat is None:
            self.heartbeat = asyncio.get_running_loop().create_task(beat())
        await self.dht.publish_node(self.record, heartbeat_s=2.0)
        return self.me

    async def member(self, stage: int, peers: list[str], from_iteration: int) -> list[dict]:
        """Tell ``peers`` she aggregates from ``from_iteration``; refused as stale (a fast stage stepped past
        it meanwhile), she asks again ahead of the furthest receiver, as an honest joiner does. The answers of
        the last round."""
        answers: list[dict] = []
        for attempt in range(4):
            answers = await self._member_round(stage, peers, from_iteration)
            if answers and all(a["accepted"] for a in answers):
                break
            furthest = max((int(a.get("receiver_iteration", 0)) for a in answers), default=from_iteration)
            from_iteration = max(from_iteration, furthest) + (4 << attempt)
        return answers

    async def _member_round(self, stage: int, peers: list[str], from_iteration: int) -> list[dict]:
        self.handlers.answers.clear()
        payload = encode_control(Member(stage=stage, from_iteration=from_iteration))
        for peer in peers:
            await self.transport.send_flow(peer, payload, timeout_s=TIMEOUT_S)
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S
        while asyncio.get_running_loop().time() < deadline:
            answers = [a for a in self.handlers.answers
                       if a.get("kind") == "member_answer" and a.get("from_iteration") == from_iteration]
            if {a["from"] for a in answers} >= set(peers):
                return answers
            await asyncio.sleep(0.05)
        return answers

    async def signed(self, stage: int, iteration: int, payload: torch.Tensor, count: int, bound: int,
                     tags: dict) -> dict:
        digest = await grad_digest(payload)
        message = contribution_message(stage, iteration, self.me, count, bound, digest, tags)
        return {**tags, **split_signature(self.dht.node_key.sign(message))}

    async def contribute(self, peer: str, stage: int, iteration: int, payload: torch.Tensor, count: int,
                         bound: int, view: tuple[str, ...], tags: dict) -> str:
        message = AggMessage(CONTRIB, iteration, tuple(sorted(view)), origin=self.me, count=count, bound=bound,
                             tags=await self.signed(stage, iteration, payload, count, bound, tags))
        meta = encode_aggregation(self.me, stage, message)
        return await self.send("forward", peer, meta, payload)

    async def poison(self, stage: int, factor: int) -> str:
        """Be a contributing member of ``stage``: for every iteration its replicas work on, push −factor times
        the latest honest contribution she received (zeros of count 0 before the first) to each of them."""
        async def loop() -> None:
            pushed: set[int] = set()
            while True:
                replicas = {p: r for p, r in (await self.nodes()).items() if r.stage == stage and p != self.me}
                view = tuple(sorted({*replicas, self.me}))
                for t in sorted(({r.iteration for r in replicas.values()} | self.handlers.iterations) - pushed):
                    honest = self.handlers.honest
                    evil, count, bound = ((honest[0] * -factor, honest[1], min(honest[2] * factor, BOUND_LIMIT))
                                          if honest else (None, 0, 0))
                    for peer in replicas:
                        payload = evil if evil is not None else torch.zeros(self.numel(stage), dtype=torch.int64)
                        await self.contribute(peer, stage, t, payload, count, bound, view, {})
                    pushed.add(t)
                self.handlers.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.handlers.wake.wait(), 0.5)

        self.poisoner = asyncio.get_running_loop().create_task(loop())
        return "poisoning"

    def numel(self, stage: int) -> int:
        if stage not in self._numel:
            self._numel[stage] = build_part(self.spec, stage, "cpu").numel
        return self._numel[stage]

    async def loss_bomb(self, holder: str, iteration: int) -> str:
        """A data holder's contribution whose loss sum overflows (sent again while the holder does not know
        her record yet)."""
        _, spec = await self.run()
        numel = build_part(spec, 0, "cpu").numel
        tags = {"loss_sum": 1e300, "n_loss": 1, "tokens": spec.microbatch_size * spec.seq_len}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20.0
        while True:
            result = await self.contribute(holder, 0, iteration, torch.zeros(numel, dtype=torch.int64), 1, 0,
                                           (holder, self.me), tags)
            if "does not serve" not in result or loop.time() > deadline:
                return result
            await asyncio.sleep(0.5)

    # -- messages she may not send --------------------------------------------------------------------------
    async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> str:
        call = self.transport.forward if kind == "forward" else self.transport.backward
        try:
            ack = await call(peer, meta, tensor, timeout_s=TIMEOUT_S)
        except TransportError as e:
            return f"error {getattr(e, 'kind', type(e).__name__)}: {e}"
        if ack.duplicate:
            return "duplicate"
        return "accepted" if ack.accepted else f"refused: {ack.reason}"

    async def control(self, relays: list[str], holder: str, stage: int, iteration: int) -> dict[str, Any]:
        closed = encode_control(Closed(iteration=iteration + 3, data_holders=(holder,), microbatches=0))
        for relay in relays:
            await self.transport.send_flow(relay, closed, timeout_s=TIMEOUT_S)
        view = encode_aggregation(self.me, stage, AggMessage(VIEW, iteration + 1, tuple(sorted(relays))))
        return {relay: await self.send("forward", relay, view, torch.zeros(0)) for relay in relays}

    async def query(self, target: str, victim: str, stage: int, iteration: int) -> str:
        meta = encode_aggregation(self.me, stage, AggMessage(QUERY, iteration, (victim,), epoch=0))
        return await self.send("forward", target, meta, torch.zeros(0))

    async def malformed(self, peer: str, holder: str, stage: int, iteration: int) -> dict[str, str]:
        _, spec = await self.run()
        shape = (spec.microbatch_size, spec.seq_len, build_part(spec, max(stage, 1), "cpu").module.config.hidden_size)
        bad = {"wrong_width": torch.zeros(shape[0], shape[1], shape[2] + 1),
               "int64": torch.zeros(shape, dtype=torch.int64), "empty": torch.zeros(0),
               "nan": torch.full(shape, math.nan), "seq_x64": torch.zeros(shape[0], shape[1] * 64, shape[2])}
        meta = TransferMeta(microbatch=MicrobatchId(data_holder=holder, iteration=iteration, index=0), stage=stage,
                            path=(holder,))
        return {name: await self.send("forward", peer, meta, tensor) for name, tensor in bad.items()}

    async def backward_spray(self, peer: str, holder: str, iteration: int, seconds: float,
                             until: str, span: int = 40) -> dict[str, Any]:
        """Gradients for the microbatches the peer may hold now (``span`` iterations from ``iteration`` on), from
        someone it never sent them to, until a refusal says ``until`` (or ``seconds`` pass)."""
        loop, seen = asyncio.get_running_loop(), {"accepted": 0, "refused": 0, "until_seen": False}
        deadline = loop.time() + seconds
        _, spec = await self.run()
        shape = (spec.microbatch_size, spec.seq_len, build_part(spec, 1, "cpu").module.config.hidden_size)
        while loop.time() < deadline and not seen["until_seen"]:
            for t in range(iteration, iteration + span):
                for index in range(spec.microbatches_per_dh):
                    meta = TransferMeta(microbatch=MicrobatchId(data_holder=holder, iteration=t, index=index),
                                        stage=1, path=(holder, peer))
                    result = await self.send("backward", peer, meta, torch.ones(shape))
                    seen["accepted" if result in ("accepted", "duplicate") else "refused"] += 1
                    seen["until_seen"] = seen["until_seen"] or until in result
        return seen

    async def streams(self, peer: str, count: int, hold_s: float) -> dict[str, int]:
        """Open ``count`` bulk forward streams and send nothing on them for ``hold_s``."""
        name = TransportServicer.bulk_name(self.transport.limits.namespace, "bulk_forward")
        from hivemind.p2p import PeerID

        opened, busy = [], 0
        for _ in range(count):
            _, reader, writer = await self.transport.p2p.call_binary_stream_handler(PeerID.from_base58(peer), name)
            opened.append((reader, writer))
        await asyncio.sleep(0.5)
        for reader, _ in opened:
            try:
                head = await asyncio.wait_for(reader.read(4096), 0.2)
                busy += b"busy" in head
            except asyncio.TimeoutError:
                pass
        await asyncio.sleep(hold_s)
        for _, writer in opened:
            writer.close()
        return {"opened": len(opened), "busy": busy}

    async def serve_noised(self, stage: int, iteration: int) -> str:
        """Serve a noised state of ``stage`` as iteration ``iteration`` and announce its hash in a record."""
        _, spec = await self.run()
        part = build_part(spec, stage, "cpu")
        with torch.no_grad():
            for p in part.module.parameters():
                p.add_(torch.randn_like(p))
        digest = part.state_hash()
        self.handlers.state = StateBlob(stage=stage, iteration=iteration, data=part.state_bytes())
        await self.become("relay", stage, iteration=iteration, capacity=64, weight_hash=digest)
        return digest


async def main(initial_peer: str) -> None:
    dht = await SwarmDHT.create(initial_peers=[initial_peer])
    handlers = Handlers()
    transport = await Transport.start(await dht.replicate_p2p(), handlers)
    mallory = handlers.mallory = Mallory(dht, transport, handlers)
    print(json.dumps({"ready": True, "peer_id": dht.peer_id}), flush=True)
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        command = json.loads(line)
        name, args = command.pop("do"), command
        if name == "quit":
            break
        try:
            result: Any = await getattr(mallory, name)(**args)
        except Exception as e:  # report, keep serving: the test decides
            result = f"failed: {type(e).__name__}: {e}"
        print(json.dumps({"result": result}, default=str), flush=True)
    await transport.close()
    await dht.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
