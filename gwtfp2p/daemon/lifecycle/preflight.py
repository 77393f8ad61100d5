"""Checks a joining node makes before it builds anything, each failing with one line a user can act on.

* ``check_versions``: its initial peers speak the same protocol versions (``hello``); a peer that does
  not answer (a stock ``hivemind-dht`` bootstrap) is skipped, one that answers other versions stops
  the join ("upgrade").
* ``check_same_run``: a joining node given ``--run-spec`` joins that run only; a swarm training another
  one is an error (drop ``--run-spec`` to join it, or ``--new-run`` to start yours).
``PROTOCOL_VERSIONS`` is what this node's ``hello`` answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from gwtfp2p.config import ConfigError, RunSpec
from gwtfp2p.dht.records import RECORD_VERSION, run_id_of
from gwtfp2p.transport import TransportError, TransportLimits
from gwtfp2p.transport.hello import ask_hello
from gwtfp2p.transport.messages import WIRE_VERSION

logger = logging.getLogger(__name__)
# Bump when daemons of two versions cannot train together (messages, iteration protocol). 2: the flow's
# ``Residual`` carries ``paths`` (loop-free labels), which a version-1 daemon's strict decoder refuses.
DAEMON_PROTOCOL = 2
PROTOCOL_VERSIONS = {"daemon": DAEMON_PROTOCOL, "records": RECORD_VERSION, "wire": WIRE_VERSION}


class IncompatibleVersion(ConfigError):
    """An initial peer speaks other protocol versions than this node."""


class OtherRun(ConfigError):
    """The swarm trains another run than the one ``--run-spec`` describes."""


def _peer_id(maddr: str) -> str | None:
    return maddr.rsplit("/p2p/", 1)[1] if "/p2p/" in maddr else None


def mismatch(theirs: dict[str, int], ours: dict[str, int] = PROTOCOL_VERSIONS) -> str:
    """The versions that differ ("" if none), as "name: theirs vs ours"; a version they lack counts as 0."""
    return ", ".join(f"{name} {theirs.get(name, 0)} (this node: {ours[name]})" for name in sorted(ours)
                     if theirs.get(name, 0) != ours[name])


async def check_versions(p2p: Any, initial_peers: Sequence[str], *, timeout_s: float) -> int:
    """``IncompatibleVersion`` if an initial peer answers other versions; the number that answered."""
    peers = [p for p in dict.fromkeys(_peer_id(m) for m in initial_peers) if p]
    namespace = TransportLimits().namespace

    async def ask(peer: str) -> tuple[str, dict[str, int] | None]:
        try:
            return peer, (await ask_hello(p2p, peer, namespace=namespace, timeout_s=timeout_s)).versions
        except TransportError as e:
            logger.info("no hello from %s (not a gwtf node, or gone): %s", peer, e)
            return peer, None

    answered = 0
    for peer, versions in await asyncio.gather(*(ask(p) for p in peers)):
        if versions is None:
            continue
        answered += 1
        if different := mismatch(versions):
            raise IncompatibleVersion(
                f"--initial-peers: {peer} speaks protocol versions {different}; nodes of these versions cannot "
                "train together: install the gwtf version the swarm runs (pip install -U gwtf), or join "
                "another swarm")
    return answered


def describe(spec: RunSpec) -> str:
    stages = f"{spec.n_stages} stage{'s' if spec.n_stages != 1 else ''}"
    return f"run {run_id_of(spec)} ({spec.model_family} {spec.model_preset}, {stages}, seed {spec.seed})"


def check_same_run(wanted: RunSpec | None, swarm: RunSpec) -> None:
    """``OtherRun`` if ``--run-spec`` (``wanted``) describes another run than the swarm's."""
    if wanted is not None and run_id_of(wanted) != run_id_of(swarm):
        raise OtherRun(f"--run-spec: the swarm at --initial-peers trains {describe(swarm)}, your file describes "
                       f"{describe(wanted)}; drop --run-spec to join the swarm's run, or add --new-run "
                       "(data holders) to start yours")
