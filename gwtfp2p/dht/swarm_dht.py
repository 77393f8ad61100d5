"""The one module that talks to ``hivemind.DHT``: an asyncio facade with a deadline on every call.

hivemind's DHT runs in a forked child process (its p2pd is a grandchild); every call here goes
through ``return_future=True`` and is awaited with a timeout, so the event loop never blocks.
Owns: start/join/shutdown, publishing and reading run-spec and node records. Every value is sealed
(signed by this node's identity key and bound to its key, subkey and expiration, ``sealed.py``) and
every node validates what it stores and reads (``validator.py``). Record formats are in ``records.py``;
RPCs over the shared libp2p daemon are the transport's business (``replicate_p2p``).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import ctypes
import functools
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from hivemind.dht import DHT
from hivemind.p2p import P2P
from hivemind.utils import get_dht_time
from hivemind.utils.multiaddr import Multiaddr

from gwtfp2p.dht.diagnose import diagnose_peers
from gwtfp2p.dht.errors import BootstrapError, DHTClosed, DHTError, DHTStartError, DHTTimeout
from gwtfp2p.dht.hivemind_log import route_hivemind_logs
from gwtfp2p.dht.identity import IdentityError, NodeKey
from gwtfp2p.dht.p2pd_options import RelayOptions, extra_p2pd_args
from gwtfp2p.dht.probe import start_error
from gwtfp2p.dht.records import (
    MAX_ADMITTED,
    AdmittedRecord,
    NodeRecord,
    RunSpecRecord,
    encode_record,
    parse_admitted_record,
    parse_node_record,
    parse_run_spec_record,
)
from gwtfp2p.dht.rejoin import rejoin_peers
from gwtfp2p.dht.run_choice import choose_run
from gwtfp2p.dht.sealed import CURRENT_RUN_KEY, Sealed, open_entries, seal
from gwtfp2p.dht.validator import SealedValueValidator

logger = logging.getLogger(__name__)

LOOPBACK_MADDRS = ("/ip4/127.0.0.1/tcp/0",)
MAX_RUNS_EXAMINED = 8  # runs under gwtf/current-run whose members are read to choose one
BOOTSTRAP_FAILED = "failed to connect to bootstrap peers"  # p2pd's message when it reached none of them
RELAYED_START_TRIES = 3  # starts of a relayed node's p2pd that lost the bootstrap race (``bootstrap_race``)
_PR_SET_PDEATHSIG = 1


def spec_key(run_id: str) -> str:
    return f"gwtf/{run_id}/spec"


def nodes_key(run_id: str) -> str:
    return f"gwtf/{run_id}/nodes"


def admitted_key(run_id: str) -> str:
    return f"gwtf/{run_id}/admitted"


def _check_maddrs(maddrs: Sequence[str], flag: str) -> list[str]:
    checked = []
    for maddr in maddrs:
        try:
            checked.append(str(Multiaddr(str(maddr))))
        except Exception as e:  # multiaddr raises several unrelated types on garbage
            raise DHTStartError(f"{flag}: {maddr!r} is not a multiaddr ({e}); "
                                f"expected e.g. /ip4/1.2.3.4/tcp/31337/p2p/12D3KooW...") from e
    return checked


async def _arm_parent_death_signal(_dht: DHT, _node: Any, parent_pid: int) -> bool:
    """Runs inside the DHT process: die with the owner even if it is SIGKILLed (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent_pid:  # the owner died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return True


async def _visible_maddrs(_dht: DHT, node: Any) -> list[str]:
    return [str(m) for m in await node.get_visible_maddrs()]


async def _daemon_listen_maddr(_dht: DHT, node: Any) -> str:
    return str(node.p2p.daemon_listen_maddr)


async def _peer_id(_dht: DHT, node: Any) -> str:
    return node.peer_id.to_base58()


def _read_key(path: str) -> NodeKey | None:
    """The identity key p2pd was started with (hivemind wrote the file if it was missing)."""
    try:
        return NodeKey.load(path)
    except IdentityError as e:
        logger.debug("no usable identity key at %s: %s", path, e)
        return None


def bootstrap_race(relay_mode: str, error: str) -> bool:
    """Whether a failed start is p2pd's bootstrap race of a node behind a NAT: its relay finder connects to the
    trusted relays (which are initial peers) as p2pd starts, and p2pd's ``connectBootstrapPeers`` skips, without
    counting it, a bootstrap peer it is already connected to, so it finds none and exits (go-libp2p-daemon's
    ``bootstrap.go``). Seen once in 10 starts of ``tests/integration/test_netns_nat.py``'s NAT'd relay."""
    return relay_mode == "relayed" and BOOTSTRAP_FAILED in error


async def _start_dht(peers: Sequence[str], kwargs: dict[str, Any], validator: SealedValueValidator,
                     relay: RelayOptions, startup_timeout_s: float) -> DHT:
    """One start of the DHT process and its p2pd; shut down again if it does not come up."""
    dht = DHT(initial_peers=list(peers) or None, start=False, await_ready=False, record_validators=[validator],
              **kwargs)
    with extra_p2pd_args(relay):  # the DHT process forks with them, and starts its p2pd with them
        dht.run_in_background(await_ready=False)
    try:
        await asyncio.wait_for(asyncio.to_thread(dht.wait_until_ready, startup_timeout_s + 1.0),
                               startup_timeout_s + 2.0)
    except (asyncio.TimeoutError, concurrent.futures.TimeoutError) as e:
        await _stop_unready(dht)
        raise DHTTimeout(f"the DHT did not start within {startup_timeout_s:.0f} s") from e
    except BaseException:
        await _stop_unready(dht)
        raise
    return dht


async def _stop_unready(dht: DHT) -> None:
    """Stop a DHT process that did not come up, killing it if it does not stop: it has not armed its
    parent-death signal yet, so it (and its p2pd) would outlive this node (seen: 85 s and more)."""
    await asyncio.to_thread(dht.shutdown)
    if dht.is_alive():
        dht.kill()


async def _start_error(e: BaseException, initial_peers: Sequence[str]) -> DHTError:
    text = str(e)
    if BOOTSTRAP_FAILED in text or "bootstrap failed" in text:
        lines = await diagnose_peers(initial_peers)
        return BootstrapError("none of the initial peers answered; tried " + "; ".join(lines)
                              + ". Check --initial-peers (address, port, /p2p/ id) and that the peer runs")
    if "already taken" in text:
        return DHTStartError(f"{text}; another running node uses this identity file (--identity)")
    return start_error(text)


def _peer_ids(maddrs: Sequence[str]) -> tuple[str, ...]:
    return tuple(m.rsplit("/p2p/", 1)[1] for m in maddrs if "/p2p/" in m)


class SwarmDHT:
    """Async handle on one hivemind DHT node; create with ``await SwarmDHT.create(...)``."""

    def __init__(self, dht: DHT, peer_id: str, call_timeout_s: float, node_key: NodeKey | None = None,
                 verify_signatures: bool = True, initial_peer_ids: tuple[str, ...] = ()):
        self._dht = dht
        self.peer_id = peer_id
        self.call_timeout_s = call_timeout_s
        self.node_key = node_key  # this node's identity key: it seals every value we store
        self.verify_signatures = verify_signatures
        self.initial_peer_ids = initial_peer_ids  # whose run we join when the DHT holds several
        self._p2p: P2P | None = None
        self._last_expiration: dict[tuple[str, str | None], float] = {}
        self._closed = False

    @classmethod
    async def create(
        cls,
        *,
        initial_peers: Sequence[str] = (),
        host_maddrs: Sequence[str] = LOOPBACK_MADDRS,
        announce_maddrs: Sequence[str] = (),
        identity_path: str | None = None,
        client_mode: bool = False,
        startup_timeout_s: float = 30.0,
        call_timeout_s: float = 10.0,
        verify_signatures: bool = True,
        relay: RelayOptions | None = None,
        check_identity_free: bool = True,
    ) -> SwarmDHT:
        """Start a DHT node (a new swarm if ``initial_peers`` is empty, else join through them).

        Raises ``BootstrapError`` when no initial peer answers, ``DHTStartError`` for local problems
        (port taken, bad multiaddr, identity in use) and ``DHTTimeout`` past ``startup_timeout_s``.
        Create it before starting threads or initializing CUDA: the DHT process is forked. Without
        ``identity_path`` the node gets a fresh identity key (a file in a temporary directory that is
        removed once p2pd read it): the key signs every value this node stores. ``verify_signatures``
        False (signatures off, to measure their cost) must be the same on every node of a swarm.
        ``relay`` says how p2pd relays (``p2pd_options.RelayOptions``: a public node relays for others, a
        relayed one is reached through reachable peers); ``check_identity_free`` False skips hivemind's
        extra p2pd that asks the initial peers whether the identity is in use (a key we hold locked).
        """
        route_hivemind_logs()
        peers = _check_maddrs(initial_peers, "--initial-peers")
        kwargs: dict[str, Any] = dict(host_maddrs=_check_maddrs(host_maddrs, "--host-maddrs"),
                                      client_mode=client_mode, startup_timeout=startup_timeout_s)
        if announce_maddrs:
            kwargs["announce_maddrs"] = _check_maddrs(announce_maddrs, "--announce")
        relay = relay or RelayOptions()
        scratch = None if identity_path is not None else tempfile.TemporaryDirectory(prefix="gwtf-identity-")
        # a fresh key cannot be in use anywhere: skip hivemind's extra p2pd that asks (≈ 1 s of start-up)
        kwargs.update(relay.hivemind_kwargs(), check_if_identity_free=check_identity_free and scratch is None)
        kwargs["client_mode"] = kwargs["client_mode"] or client_mode
        kwargs["identity_path"] = identity_path if scratch is None else os.path.join(scratch.name, "identity.key")
        validator = SealedValueValidator(verify_signatures)
        try:
            for attempt in range(1, RELAYED_START_TRIES + 1):
                try:
                    dht = await _start_dht(peers, kwargs, validator, relay, startup_timeout_s)
                    break
                except DHTError:
                    raise
                except Exception as e:
                    if not (bootstrap_race(relay.mode, str(e)) and attempt < RELAYED_START_TRIES):
                        raise await _start_error(e, peers) from e
                    logger.warning("p2pd gave up on its bootstrap peers at once (try %d of %d): behind a NAT it "
                                   "connects to its relays, the same peers, as it starts, and it does not count a "
                                   "bootstrap peer it is connected to already; starting it again", attempt,
                                   RELAYED_START_TRIES)
                    kwargs["check_if_identity_free"] = False  # the peers may still see our last try with it
        finally:
            key = _read_key(kwargs["identity_path"])
            if scratch is not None:
                scratch.cleanup()
        node = cls(dht, peer_id="", call_timeout_s=call_timeout_s, node_key=key,
                   verify_signatures=verify_signatures, initial_peer_ids=_peer_ids(peers))
        try:
            node.peer_id = await node._run(_peer_id)
            await node._run(_arm_parent_death_signal, parent_pid=os.getpid())
            if key is None or key.peer_id != node.peer_id:
                raise DHTStartError(f"the identity key does not match this node's peer id {node.peer_id}; "
                                    "check --identity (a libp2p RSA or Ed25519 private-key file)")
        except DHTError:
            await node.shutdown()
            raise
        return node

    async def _await(self, future: concurrent.futures.Future, what: str, timeout_s: float | None) -> Any:
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except asyncio.TimeoutError as e:
            raise DHTTimeout(f"DHT {what} did not finish within {timeout_s:.1f} s") from e
        except (BrokenPipeError, EOFError, ConnectionError) as e:
            raise DHTClosed(f"DHT {what} failed: the DHT process is gone ({e!r})") from e

    def _check_open(self, what: str) -> None:
        if self._closed or not self._dht.is_alive():
            raise DHTClosed(f"cannot {what}: the DHT is shut down")

    async def _run(self, coro: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        self._check_open("run a DHT coroutine")
        try:
            future = self._dht.run_coroutine(functools.partial(coro, **kwargs), return_future=True)
        except (BrokenPipeError, OSError) as e:
            raise DHTClosed(f"the DHT process is gone ({e!r})") from e
        return await self._await(future, coro.__name__.lstrip("_"), timeout_s)

    async def store(self, key: str, value: bytes, expiration_time: float, subkey: str | None = None,
                    timeout_s: float | None = None) -> bool:
        """Store bytes, sealed by this node (``sealed.seal``); True if at least one DHT peer (maybe only
        this one) accepted the value. Peers refuse values that break gwtf's ownership rules.

        An entry is replaced only by one with a later expiration; this method never goes backwards.
        """
        self._check_open("store")
        previous = self._last_expiration.get((key, subkey), 0.0)
        expiration_time = max(expiration_time, previous + 1e-3)
        signer = self.node_key if self.verify_signatures else None
        sealed = seal(signer, key, subkey or "", expiration_time, value)
        try:
            future = self._dht.store(key, sealed, expiration_time, subkey=subkey, return_future=True)
        except (BrokenPipeError, OSError) as e:
            raise DHTClosed(f"the DHT process is gone ({e!r})") from e
        ok = bool(await self._await(future, f"store {key!r}", timeout_s))
        if ok:
            self._last_expiration[(key, subkey)] = expiration_time
        return ok

    async def get(self, key: str, latest: bool = True, timeout_s: float | None = None) -> Any:
        """Raw ``ValueWithExpiration`` (or None) stored under ``key``: sealed values (``opened`` opens them)."""
        self._check_open("get")
        try:
            future = self._dht.get(key, latest=latest, return_future=True)
        except (BrokenPipeError, OSError) as e:
            raise DHTClosed(f"the DHT process is gone ({e!r})") from e
        return await self._await(future, f"get {key!r}", timeout_s)

    async def visible_maddrs(self, timeout_s: float | None = None) -> list[str]:
        """Multiaddrs (with ``/p2p/<id>``) other peers can use as ``--initial-peers``."""
        return await self._run(_visible_maddrs, timeout_s)

    # ----- run spec -----

    async def publish_run_spec(self, record: RunSpecRecord, *, ttl_s: float, current: bool = True,
                               timeout_s: float | None = None) -> bool:
        """Publish the spec under ``gwtf/<run_id>/spec`` (and ``gwtf/current-run`` if ``current``), each
        under our own subkey: the record must be published by this node."""
        if record.published_by != self.peer_id:
            raise ValueError(f"record.published_by {record.published_by} is not this node ({self.peer_id})")
        raw = encode_record(record)
        expiration = get_dht_time() + ttl_s
        ok = await self.store(spec_key(record.run_id), raw, expiration, subkey=self.peer_id, timeout_s=timeout_s)
        if current:
            ok = await self.store(CURRENT_RUN_KEY, raw, expiration, subkey=self.peer_id, timeout_s=timeout_s) and ok
        return ok

    async def _entries(self, key: str, timeout_s: float | None) -> dict[str, Sealed]:
        """The valid sealed entries under ``key`` by subkey (forged, garbage or misplaced ones dropped)."""
        found = await self.get(key, timeout_s=timeout_s)
        return {} if found is None else open_entries(found.value, key, verify_signature=self.verify_signatures)

    async def read_run_spec(self, run_id: str, timeout_s: float | None = None) -> RunSpecRecord | None:
        """The spec of run ``run_id`` (as any of its publishers signed it), or None if absent."""
        for sealed in (await self._entries(spec_key(run_id), timeout_s)).values():
            return parse_run_spec_record(sealed.payload)
        return None

    async def read_current_run(self, timeout_s: float | None = None) -> RunSpecRecord | None:
        """The run to join (``gwtf/current-run``), or None. Anyone may publish a run there; when several
        are, ``run_choice.choose_run`` picks the one our initial peers belong to."""
        runs = {s.signer: parse_run_spec_record(s.payload) for s in (await self._entries(CURRENT_RUN_KEY,
                                                                                      timeout_s)).values()}
        members: dict[str, set[str]] = {}
        if len({r.run_id for r in runs.values()}) > 1:
            for run_id in sorted({r.run_id for r in runs.values()})[:MAX_RUNS_EXAMINED]:
                members[run_id] = set(await self.read_nodes(run_id, timeout_s))
        return choose_run(runs, members, self.initial_peer_ids)

    async def publish_admitted(self, run_id: str, peers: Sequence[str], *, ttl_s: float,
                               timeout_s: float | None = None) -> bool:
        """Publish the peers this node (a permissioned run's creator) admits, under its own subkey."""
        record = AdmittedRecord(run_id=run_id, peers=tuple(sorted(set(peers)))[:MAX_ADMITTED])
        return await self.store(admitted_key(run_id), encode_record(record), get_dht_time() + ttl_s,
                                subkey=self.peer_id, timeout_s=timeout_s)

    async def read_admitted(self, run_id: str, creator: str, timeout_s: float | None = None) -> frozenset[str] | None:
        """The peers ``creator`` admits to run ``run_id`` (None: it published no list)."""
        sealed = (await self._entries(admitted_key(run_id), timeout_s)).get(creator)
        return None if sealed is None else frozenset(parse_admitted_record(sealed.payload).peers)

    # ----- node records -----

    async def publish_node(self, record: NodeRecord, *, heartbeat_s: float,
                           timeout_s: float | None = None) -> bool:
        """Heartbeat: store this node's record, expiring at now + 2 × ``heartbeat_s``."""
        if record.peer_id != self.peer_id:
            raise ValueError(f"record.peer_id {record.peer_id} is not this node ({self.peer_id})")
        if record.updated_at == 0.0:
            record = record.model_copy(update={"updated_at": get_dht_time()})
        record = record.model_copy(update={"public_key": ""})  # readers take it from the signature
        expiration = get_dht_time() + 2.0 * heartbeat_s
        return await self.store(nodes_key(record.run_id), encode_record(record), expiration,
                                subkey=self.peer_id, timeout_s=timeout_s)

    async def publish_leaving(self, record: NodeRecord, *, heartbeat_s: float,
                              timeout_s: float | None = None) -> bool:
        """Announce that this node leaves: its record turns ``leaving`` until it expires."""
        leaving = record.model_copy(update={"state": "leaving", "updated_at": get_dht_time()})
        return await self.publish_node(leaving, heartbeat_s=heartbeat_s, timeout_s=timeout_s)

    async def read_nodes(self, run_id: str, timeout_s: float | None = None) -> dict[str, NodeRecord]:
        """All live node records of a run by peer id; invalid, forged or misplaced entries are dropped."""
        entries = await self._entries(nodes_key(run_id), timeout_s)
        return {peer: parse_node_record(sealed.payload).model_copy(
            update={"public_key": base64.b64encode(sealed.public_key).decode()}) for peer, sealed in entries.items()}

    # ----- P2P and lifecycle -----

    async def replicate_p2p(self, timeout_s: float | None = None) -> P2P:
        """An in-process handle on the DHT's libp2p daemon, for the transport's RPC handlers."""
        if self._p2p is None:
            maddr = await self._run(_daemon_listen_maddr, timeout_s)
            try:
                self._p2p = await asyncio.wait_for(P2P.replicate(Multiaddr(maddr)),
                                                   timeout_s or self.call_timeout_s)
            except asyncio.TimeoutError as e:
                raise DHTTimeout("connecting to the DHT's p2p daemon timed out") from e
        return self._p2p

    async def rejoin(self, maddrs: Sequence[str], timeout_s: float = 5.0) -> int:
        """After an outage: dial these peers (``.../p2p/<id>``) and add them back to the DHT's routing
        table (``rejoin.py``); the number that answered."""
        answered = await self._run(rejoin_peers, 2 * timeout_s + 2.0, maddrs=list(maddrs)[:32],
                                   dial_timeout_s=timeout_s)
        return int(answered)

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the DHT process and its p2pd; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._p2p is not None:
            with contextlib.suppress(Exception):
                await self._p2p.shutdown()
        try:
            await asyncio.wait_for(asyncio.to_thread(self._dht.shutdown), timeout_s)
        except asyncio.TimeoutError:
            logger.warning("DHT process did not stop within %.0f s; killing it", timeout_s)
        if self._dht.is_alive():
            self._dht.kill()

