"""A permissioned run: only the peers its creator admits take part (docs/security.md).

The creator (``gwtf join --admit FILE``) publishes the peer ids in FILE, one per line, signed, under
``gwtf/<run>/admitted`` (re-read and re-published at every view round: append a line to admit a peer).
Every other node given the creator's peer id (``--permissioned PEER``) reads that list at every view
round and keeps only admitted peers' records in its view; the peers it does not see are strangers to
its guard and its aggregation. Without either flag the run is open and everyone is admitted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from gwtfp2p.dht import DHTError

logger = logging.getLogger(__name__)
LIST_TTL_S = 3600.0


class AdmittedStore(Protocol):
    async def publish_admitted(self, run_id: str, peers: list[str], *, ttl_s: float) -> bool: ...
    async def read_admitted(self, run_id: str, creator: str) -> frozenset[str] | None: ...


def read_peer_file(path: str) -> list[str]:
    """Peer ids, one per line (blank lines and ``#`` comments skipped)."""
    lines = Path(path).read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


class AdmittedPeers:
    """Who takes part in this node's run: everyone (open), or the creator's list."""

    def __init__(self, self_id: str, run_id: str, *, creator: str = "", admit_path: str = "") -> None:
        self.self_id = self_id
        self.run_id = run_id
        self.admit_path = admit_path  # we are the creator: our list lives in this file
        self.creator = self_id if admit_path else creator  # whose list counts ("": an open run)
        self.peers: frozenset[str] = frozenset()  # nobody but the creator until the first list is read

    @property
    def permissioned(self) -> bool:
        return bool(self.creator)

    def allows(self, peer: str) -> bool:
        return not self.permissioned or peer in (self.creator, self.self_id) or peer in self.peers

    async def update(self, store: AdmittedStore) -> None:
        """Publish our list (the creator) or read the creator's; a failure keeps the last one."""
        if not self.permissioned:
            return
        try:
            if self.admit_path:
                peers = read_peer_file(self.admit_path)
                await store.publish_admitted(self.run_id, peers, ttl_s=LIST_TTL_S)
                self.peers = frozenset(peers)
            else:
                found = await store.read_admitted(self.run_id, self.creator)
                if found is not None:
                    self.peers = found
        except (OSError, DHTError, ValueError) as e:
            logger.warning("the admitted peers of run %s were not updated: %s", self.run_id, e)
