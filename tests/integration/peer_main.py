"""A peer in its own process for integration tests: ``python -m tests.integration.peer_main MODE [PEERS...]``.

MODE ``transport``: a standalone ``Transport`` whose handlers echo: a forward comes back as a
backward of the same tensor and meta, a flow message comes back as ``b"echo:" + payload``, and
stage 1 serves ``state_bytes()``. MODE ``dht``: a ``SwarmDHT`` joined through PEERS. Either way the
first stdout line is a JSON readiness signal (peer id, maddrs, pid); SIGTERM shuts down cleanly.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import torch

from gwtfp2p.dht import SwarmDHT, route_hivemind_logs
from gwtfp2p.transport import Ack, StateBlob, TransferMeta, Transport, TransportError

STATE_STAGE = 1
STATE_ITERATION = 5


def state_bytes() -> bytes:
    """What stage 1's state download serves: 3 MiB + 123 deterministic bytes (several parts)."""
    return torch.randint(0, 256, (3 * 2**20 + 123,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(42)).numpy().tobytes()


class EchoHandlers:
    def __init__(self) -> None:
        self.transport: Transport | None = None
        self._tasks: set[asyncio.Task] = set()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _echo_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> None:
        assert self.transport is not None
        try:
            await self.transport.backward(sender, meta, tensor, timeout_s=30)
        except TransportError as e:
            print(f"echo backward failed: {e!r}", file=sys.stderr)

    async def _echo_flow(self, sender: str, payload: bytes) -> None:
        assert self.transport is not None
        try:
            await self.transport.send_flow(sender, b"echo:" + payload, timeout_s=10)
        except TransportError as e:
            print(f"echo flow failed: {e!r}", file=sys.stderr)

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        self._spawn(self._echo_backward(sender, meta, tensor))
        return Ack()

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        return Ack(accepted=False, reason="this peer takes no backward")

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        self._spawn(self._echo_flow(sender, payload))

    async def get_state(self, stage: int) -> StateBlob | None:
        if stage != STATE_STAGE:
            return None
        return StateBlob(stage=stage, iteration=STATE_ITERATION, data=state_bytes())


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _ready(peer_id: str, maddrs: list[str]) -> None:
    print(json.dumps({"peer_id": peer_id, "maddrs": maddrs, "pid": os.getpid()}), flush=True)


async def run_transport() -> None:
    handlers = EchoHandlers()
    transport = await Transport.standalone(handlers)
    handlers.transport = transport
    _ready(transport.peer_id, await transport.visible_maddrs())
    await _wait_for_signal()
    await transport.close()


async def run_dht(initial_peers: list[str]) -> None:
    dht = await SwarmDHT.create(initial_peers=initial_peers)
    _ready(dht.peer_id, await dht.visible_maddrs())
    await _wait_for_signal()
    await dht.shutdown()


def main() -> None:
    route_hivemind_logs()
    mode, peers = sys.argv[1], sys.argv[2:]
    asyncio.run(run_transport() if mode == "transport" else run_dht(peers))


if __name__ == "__main__":
    main()
