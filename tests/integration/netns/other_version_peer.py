"""A peer answering ``hello`` with other protocol versions (``python -m tests.integration.netns.other_version_peer``).

It runs a real DHT and transport, as a gwtf node of another version would, prints one JSON line with its
addresses once ready, and serves until killed. Joining through it must fail with a clear error.
"""

from __future__ import annotations

import asyncio
import json

import torch

from gwtfp2p.daemon.lifecycle.preflight import PROTOCOL_VERSIONS
from gwtfp2p.dht import SwarmDHT
from gwtfp2p.transport import Ack, StateBlob, TransferMeta, Transport

OTHER_VERSIONS = {**PROTOCOL_VERSIONS, "daemon": PROTOCOL_VERSIONS["daemon"] + 98}


class Refuses:
    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        return Ack(accepted=False, reason="another version")

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        return Ack(accepted=False, reason="another version")

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        return None

    async def get_state(self, stage: int) -> StateBlob | None:
        return None

    async def get_steps(self, stage: int, since_iteration: int) -> StateBlob | None:
        return None


async def main() -> None:
    dht = await SwarmDHT.create()
    transport = await Transport.start(await dht.replicate_p2p(), Refuses(), versions=OTHER_VERSIONS)
    print(json.dumps({"maddrs": await transport.visible_maddrs(), "versions": OTHER_VERSIONS}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
