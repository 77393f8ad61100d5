"""Reachability at join: can peers of the swarm open a connection to this node, or must a relay carry it?

Before its own DHT starts (p2pd's relay options are fixed then), a node that listens beyond loopback
and has initial peers starts a probe on its listen address (``dht/probe.py``), reads the current
run's node records and asks up to ``MAX_CHECKERS`` gwtf peers to dial it back from a fresh libp2p
host (``transport/dialback.py``; Petals' idea, no central service). ``decide`` (pure) turns their
answers into a verdict: ``direct`` (most checkers got through: announce the address they dialed),
``relayed`` (none did: be reached through reachable checkers, ``p2pd_options``), or ``unknown``
(nobody could check: the first nodes of a run; they start as public nodes). An ``--announce``
address no checker could dial is an error. The verdict is the ``reachability`` event.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from gwtfp2p.config import ConfigError
from gwtfp2p.daemon.config import NetworkConfig, Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.dht.p2pd_options import RelayOptions
from gwtfp2p.dht.probe import ProbeNode, SwarmPeer
from gwtfp2p.transport import TransportError, TransportLimits
from gwtfp2p.transport.dialback import DialBackAnswer, DialBackRequest, ask_dialback, connect_peer

logger = logging.getLogger(__name__)
MAX_CHECKERS = 3
MAX_RELAYS = 2
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
Verdict = Literal["direct", "relayed", "unknown"]


class AnnounceError(ConfigError):
    """``--announce`` names an address none of the peers that checked could dial."""


@dataclass(frozen=True)
class Check:
    """One checker's answer (``answer`` None: it could not be asked; ``error`` says why)."""

    peer: SwarmPeer
    answer: DialBackAnswer | None
    error: str = ""

    @property
    def conclusive(self) -> bool:
        return self.answer is not None and not self.answer.refused and bool(self.answer.results)

    @property
    def reached(self) -> tuple[str, ...]:
        return tuple(r.maddr for r in self.answer.results if r.ok) if self.answer is not None else ()


@dataclass(frozen=True)
class Reachability:
    """How this node takes part: its verdict, what it announces, who relays for it, and why."""

    verdict: Verdict
    announce: tuple[str, ...] = ()
    relays: tuple[str, ...] = ()  # multiaddrs (with /p2p/<id>) of the peers that relay for us
    observed: tuple[str, ...] = ()  # the addresses the checkers saw our requests come from
    asked: int = 0
    answered: int = 0
    reached: int = 0
    errors: tuple[str, ...] = field(default=(), repr=False)

    def relay_options(self, network: NetworkConfig) -> RelayOptions:
        if self.verdict == "relayed":
            return RelayOptions(mode="relayed", trusted_relays=self.relays)
        return RelayOptions(mode="public", serve=network.relay_for_others,
                            max_circuits=network.relay_max_circuits)

    def event_fields(self) -> dict:
        return dict(verdict=self.verdict, announce=list(self.announce), relays=list(self.relays),
                    observed=list(self.observed), asked=self.asked, answered=self.answered, reached=self.reached,
                    errors=list(self.errors)[:MAX_CHECKERS])


def decide(checks: Sequence[Check], announce_given: Sequence[str]) -> Reachability:
    """The verdict from the checkers' answers (pure). ``direct`` if more than half of the conclusive
    answers reached us; ``relayed`` if none did; ``unknown`` without a conclusive answer.
    ``AnnounceError`` if ``--announce`` was given, some checker checked it, and none could dial it."""
    conclusive = [c for c in checks if c.conclusive]
    errors = tuple(f"{c.peer.peer_id}: {c.error or (c.answer.refused if c.answer else '')}" for c in checks
                   if not c.conclusive)
    observed = tuple(dict.fromkeys(c.answer.observed for c in conclusive if c.answer and c.answer.observed))
    reached = [c for c in conclusive if c.reached]
    base = dict(observed=observed, asked=len(checks), answered=len(conclusive), reached=len(reached), errors=errors)
    if announce_given and conclusive:
        tried = {r.maddr for c in conclusive for r in c.answer.results}  # type: ignore[union-attr]
        if set(announce_given) & tried and not {m for c in reached for m in c.reached} & set(announce_given):
            failures = sorted({f"{r.maddr}: {r.error}" for c in conclusive for r in c.answer.results  # type: ignore[union-attr]
                               if r.maddr in announce_given})
            raise AnnounceError(f"--announce: none of the {len(conclusive)} peer(s) that checked could dial "
                                f"{', '.join(announce_given)} ({'; '.join(failures)[:400]}). Check the port "
                                "forwarding on your router, or drop --announce to be reached through a relay")
    if not conclusive:
        return Reachability("unknown", announce=tuple(announce_given), **base)
    if 2 * len(reached) > len(conclusive):
        dialed = Counter(m for c in reached for m in c.reached)
        announce = tuple(announce_given) or tuple(m for m, _ in dialed.most_common())
        return Reachability("direct", announce=announce, **base)
    relays = tuple(relay_maddr(c.peer) for c in conclusive if not c.peer.relayed)
    return Reachability("relayed", relays=tuple(m for m in relays if m)[:MAX_RELAYS], **base)


def relay_maddr(peer: SwarmPeer) -> str:
    """A direct address of ``peer`` ending in ``/p2p/<id>`` (what p2pd takes as a trusted relay), or ""."""
    for maddr in peer.maddrs:
        if "/p2p-circuit" in maddr or maddr.startswith("/ip4/127.") or maddr.startswith("/ip6/::1/"):
            continue
        return maddr if maddr.endswith(f"/p2p/{peer.peer_id}") else f"{maddr}/p2p/{peer.peer_id}"
    return ""


def fixed_port(host: str, port: int) -> int:
    """``port``, or a free one on ``host`` if 0: the probe and the node's p2pd must listen on the same."""
    if port:
        return port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def needs_check(network: NetworkConfig) -> bool:
    return (network.reachability == "auto" and bool(network.initial_peers)
            and network.host not in LOOPBACK_HOSTS)


async def check_reachability(network: NetworkConfig, host_maddrs: Sequence[str], port: int, timings: Timings,
                             events: Events) -> Reachability:
    """The probe and the checks (see the module docstring); the ``reachability`` event."""
    started = time.monotonic()
    if network.reachability == "relayed":
        result = Reachability("relayed", relays=tuple(m for m in network.initial_peers if "/p2p/" in m)[:MAX_RELAYS])
    elif not needs_check(network):
        result = Reachability("direct" if network.reachability == "direct" else "unknown",
                              announce=network.announce_maddrs)
    else:
        async with await ProbeNode.start(initial_peers=network.initial_peers, host_maddrs=host_maddrs,
                                         timeout_s=timings.reach_timeout_s) as probe:
            peers = (await probe.swarm_peers(timings.reach_timeout_s))[:MAX_CHECKERS]
            request = DialBackRequest(ports=(port,), announce=network.announce_maddrs[:2])
            checks = await asyncio.gather(*(_ask(probe, p, request, timings) for p in peers))
        result = decide(checks, network.announce_maddrs)
    events.emit("reachability", **result.event_fields(), seconds=round(time.monotonic() - started, 3))
    logger.info("reachability: %s (%d asked, %d answered, %d reached us)", result.verdict, result.asked,
                result.answered, result.reached)
    return result


async def _ask(probe: ProbeNode, peer: SwarmPeer, request: DialBackRequest, timings: Timings) -> Check:
    try:
        await connect_peer(probe.p2p, peer.peer_id, peer.maddrs, timings.connect_timeout_s)
        answer = await ask_dialback(probe.p2p, peer.peer_id, request, namespace=TransportLimits().namespace,
                                    timeout_s=timings.reach_timeout_s)
    except TransportError as e:
        return Check(peer, None, str(e)[:200])
    return Check(peer, answer)
