"""A short-lived libp2p host and DHT client a node starts before its own DHT, to learn how it is reachable.

The probe listens where the node will listen (``--host``/``--port``), joins the swarm through the
initial peers as a DHT client, and reads the current run's node records: the gwtf peers that can
dial it back (``daemon/swarm/reachability.py`` asks them over the transport, through ``probe.p2p``).
It is shut down before the node's own DHT starts, which then knows whether to listen as a public
node or to be reached through relays (p2pd's options are fixed when it starts). A probe that cannot
reach any initial peer raises ``BootstrapError`` naming each address and what a TCP connect to it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P

from gwtfp2p.dht.diagnose import diagnose_peers, p2pd_message
from gwtfp2p.dht.errors import BootstrapError, DHTError, DHTStartError
from gwtfp2p.dht.records import NodeRecord, RecordError, RunSpecRecord, parse_node_record, parse_run_spec_record
from gwtfp2p.dht.run_choice import choose_run
from gwtfp2p.dht.sealed import CURRENT_RUN_KEY, open_entries
from gwtfp2p.dht.validator import SealedValueValidator

logger = logging.getLogger(__name__)
RELAYED_PART = "/p2p-circuit"


@dataclass(frozen=True)
class SwarmPeer:
    """A gwtf node of the current run as its record describes it."""

    peer_id: str
    maddrs: tuple[str, ...]
    relayed: bool  # its addresses go through a relay: it cannot dial us back directly either


def _initial_peer_ids(maddrs: Sequence[str]) -> set[str]:
    return {m.rsplit("/p2p/", 1)[1] for m in maddrs if "/p2p/" in m}


class ProbeNode:
    """Use ``async with await ProbeNode.start(...)``; ``p2p`` is the probe's host."""

    def __init__(self, p2p: P2P, node: DHTNode, initial_peers: tuple[str, ...], verify_signatures: bool) -> None:
        self.p2p = p2p
        self.node = node
        self.initial_peers = initial_peers
        self.verify_signatures = verify_signatures

    @classmethod
    async def start(cls, *, initial_peers: Sequence[str], host_maddrs: Sequence[str], timeout_s: float,
                    verify_signatures: bool = True) -> ProbeNode:
        """Start the probe; ``BootstrapError`` if no initial peer answers, ``DHTStartError`` if p2pd fails."""
        try:
            p2p = await P2P.create(initial_peers=list(initial_peers), host_maddrs=list(host_maddrs),
                                   dht_mode="client", use_relay=False, auto_nat=False, nat_port_map=False,
                                   startup_timeout=timeout_s)
        except Exception as e:
            raise await _start_error(e, initial_peers) from e
        try:
            node = await asyncio.wait_for(
                DHTNode.create(p2p=p2p, initial_peers=list(initial_peers), client_mode=True,
                               record_validator=SealedValueValidator(verify_signatures),
                               ensure_bootstrap_success=False), timeout_s)
        except (asyncio.TimeoutError, Exception) as e:
            await p2p.shutdown()
            raise BootstrapError(f"the initial peers answered but their DHT did not ({e!r})") from e
        return cls(p2p, node, tuple(initial_peers), verify_signatures)

    async def __aenter__(self) -> ProbeNode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _entries(self, key: str, timeout_s: float) -> dict:
        found = await asyncio.wait_for(self.node.get(key, latest=True), timeout_s)
        return {} if found is None else open_entries(found.value, key, verify_signature=self.verify_signatures)

    async def current_run(self, timeout_s: float) -> RunSpecRecord | None:
        """The run the initial peers lead to (``run_choice``), or None; ``RecordError`` if its spec is
        not one this version reads (another protocol version)."""
        runs = {s.signer: parse_run_spec_record(s.payload) for s in (await self._entries(CURRENT_RUN_KEY,
                                                                                      timeout_s)).values()}
        members: dict[str, set[str]] = {}
        if len({r.run_id for r in runs.values()}) > 1:
            for run_id in sorted({r.run_id for r in runs.values()}):
                members[run_id] = set(await self.nodes(run_id, timeout_s))
        return choose_run(runs, members, _initial_peer_ids(self.initial_peers))

    async def nodes(self, run_id: str, timeout_s: float) -> dict[str, NodeRecord]:
        out = {}
        for peer, sealed in (await self._entries(f"gwtf/{run_id}/nodes", timeout_s)).items():
            with contextlib.suppress(RecordError):
                out[peer] = parse_node_record(sealed.payload)
        return out

    async def swarm_peers(self, timeout_s: float) -> list[SwarmPeer]:
        """The online nodes of the current run with addresses, directly reachable ones first."""
        try:
            run = await self.current_run(timeout_s)
            records = {} if run is None else await self.nodes(run.run_id, timeout_s)
        except (asyncio.TimeoutError, RecordError, DHTError) as e:
            logger.info("reading the swarm's records for the reachability check failed: %s", e)
            return []
        peers = [SwarmPeer(r.peer_id, tuple(r.maddrs), any(RELAYED_PART in m for m in r.maddrs))
                 for r in records.values() if r.state == "online" and r.maddrs]
        return sorted(peers, key=lambda p: (p.relayed, p.peer_id))

    async def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.node.shutdown(), 5.0)
        with contextlib.suppress(Exception):
            await self.p2p.shutdown()


async def _start_error(e: BaseException, initial_peers: Sequence[str]) -> DHTError:
    text = str(e)
    if "failed to connect to bootstrap peers" in text or "bootstrap failed" in text:
        lines = await diagnose_peers(initial_peers)
        return BootstrapError("none of the initial peers answered; tried " + "; ".join(lines)
                              + ". Check --initial-peers (address, port, /p2p/ id) and that the peer runs")
    return start_error(text)


def start_error(text: str) -> DHTStartError:
    """p2pd could not start: the port taken, an address not on this machine, or its own message."""
    message = p2pd_message(text)
    if "address already in use" in text:
        return DHTStartError(f"the listen port is taken ({message}); pick another --port or stop the other process")
    if "cannot assign requested address" in text:
        return DHTStartError(f"--host is not an address of this machine ({message}); use 0.0.0.0 or one of "
                             "its addresses (--announce gives the address others should dial)")
    return DHTStartError(f"p2pd, the libp2p daemon, failed to start: {message}")
