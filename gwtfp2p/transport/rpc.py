"""``Transport``: one node's RPC endpoint (servicer registered + client), the daemon's entry point.

Built on a hivemind ``P2P`` handle: the DHT's (``await swarm_dht.replicate_p2p()``) in a daemon,
or a standalone one (``Transport.standalone``) in tests and benchmarks. Peers are named by base58
peer id strings, so callers never import hivemind. Owns registration, shutdown and the watcher that
repairs the control connection to p2pd (``control_link.py``), not the calls themselves
(``client.py``) nor their handling (``servicer.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence

from hivemind.p2p import P2P

from gwtfp2p.transport.client import TransportClient
from gwtfp2p.transport.control_link import ControlLink, watch_control_link
from gwtfp2p.transport.dialback import DialBackService, connect_peer
from gwtfp2p.transport.direct import DirectServer, open_server
from gwtfp2p.transport.hello import HelloService
from gwtfp2p.transport.limits import TransportLimits
from gwtfp2p.transport.link_emulation import LinkEmulator
from gwtfp2p.transport.messages import WIRE_VERSION
from gwtfp2p.transport.servicer import TransportHandlers, TransportServicer

logger = logging.getLogger(__name__)
CONTROL_CHECK_S = 0.2  # how often the control connection to p2pd is checked (two attribute reads)
CONTROL_REOPEN_TIMEOUT_S = 5.0
DIAL_BACK_TIMEOUT_S = 4.0  # one dial of a reachability check (a NAT drops it: the whole wait)


class Transport(TransportClient):
    """RPC endpoint of one node: serves ``handlers``; calls other nodes with the inherited
    ``forward``/``backward``/``send_flow``/``ping``/``fetch_state`` (see ``TransportClient``)."""

    def __init__(self, p2p: P2P, servicer: TransportServicer, link: LinkEmulator | None, owns_p2p: bool,
                 services: tuple[DialBackService | HelloService, ...] = (), direct: DirectServer | None = None):
        super().__init__(p2p, servicer.limits, link)
        self._servicer = servicer
        self._direct_server = direct  # our end of direct data channels (``direct.py``)
        self._services = services  # reachability checks (``dialback.py``), versions (``hello.py``)
        self._owns_p2p = owns_p2p
        self._closed = False
        self.peer_id: str = p2p.peer_id.to_base58()
        self.control_link = ControlLink(p2p)
        self._watch = asyncio.create_task(watch_control_link(self.control_link, CONTROL_CHECK_S,
                                                             CONTROL_REOPEN_TIMEOUT_S), name="control-link")

    @classmethod
    async def start(cls, p2p: P2P, handlers: TransportHandlers, *, limits: TransportLimits | None = None,
                    link: LinkEmulator | None = None, owns_p2p: bool = False,
                    versions: Mapping[str, int] | None = None) -> Transport:
        """Register the RPC handlers on ``p2p`` and return the endpoint; ``versions`` is what ``hello``
        answers (the daemon's protocol versions; the transport's wire version by default)."""
        limits = limits or TransportLimits()
        servicer = TransportServicer(handlers, limits)
        await servicer.add_p2p_handlers(p2p, namespace=limits.namespace)
        services = (DialBackService(p2p, limits.namespace, DIAL_BACK_TIMEOUT_S),
                    HelloService(p2p, limits.namespace, versions or {"wire": WIRE_VERSION}))
        for service in services:
            await service.register()
        direct = (await open_server(p2p, servicer.transfer_reply, limits.namespace, limits.part_timeout_s)
                  if limits.direct_channel else None)
        return cls(p2p, servicer, link, owns_p2p, services, direct)

    @classmethod
    async def standalone(cls, handlers: TransportHandlers, *, initial_peers: Sequence[str] = (),
                         host_maddrs: Sequence[str] = ("/ip4/127.0.0.1/tcp/0",),
                         limits: TransportLimits | None = None, link: LinkEmulator | None = None,
                         startup_timeout_s: float = 15.0) -> Transport:
        """A transport on its own libp2p daemon (no DHT): for tests, benchmarks and tools."""
        p2p = await P2P.create(initial_peers=list(initial_peers) or None, host_maddrs=list(host_maddrs),
                               startup_timeout=startup_timeout_s)
        try:
            return await cls.start(p2p, handlers, limits=limits, link=link, owns_p2p=True)
        except BaseException:
            await p2p.shutdown()
            raise

    @property
    def p2p(self) -> P2P:
        """The underlying hivemind handle (benchmarks and tools; the daemon has no need of it)."""
        return self._p2p

    async def visible_maddrs(self) -> list[str]:
        """This node's multiaddrs, each ending in ``/p2p/<peer id>``."""
        return [str(m) for m in await self._p2p.get_visible_maddrs()]

    async def connect(self, peer_id: str, maddrs: Sequence[str], *, timeout_s: float) -> None:
        """Open a connection to a peer at known addresses (e.g. from its DHT record)."""
        await connect_peer(self._p2p, peer_id, tuple(maddrs), timeout_s)  # relay circuits too (``maddrs.py``)

    async def close(self) -> None:
        """Stop serving (and stop the libp2p daemon if this transport started it); idempotent."""
        if self._closed:
            return
        self._closed = True
        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch
        for service in self._services:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.unregister(), 5.0)
        for direct in (self._direct_server, self.direct):
            if direct is not None:
                await direct.close()
        with contextlib.suppress(Exception):
            removal = self._servicer.remove_p2p_handlers(self._p2p, namespace=self.limits.namespace)
            await asyncio.wait_for(removal, 5.0)
        if self._owns_p2p:
            await self._p2p.shutdown()
