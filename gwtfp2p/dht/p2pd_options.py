"""How a node's libp2p daemon (p2pd) takes part in relaying: as a relay for others, or reached through one.

A *public* node (peers could dial it back, ``daemon/swarm/reachability.py``) tells p2pd so
(``forceReachabilityPublic``), which starts its circuit-relay service at once, with the limits of
``RelayOptions``. A *relayed* node (behind a NAT, nobody can dial it) tells p2pd it is private and
gives it reachable gwtf peers as static relays: p2pd reserves a slot on them at once, and peers reach
it through ``<relay>/p2p-circuit``. hivemind's ``P2P.create`` does not pass p2pd's relay limits nor
``-relayDiscovery=0`` (without it p2pd waits up to 3 minutes for 4 relay candidates before reserving
one: no reservation within 60 s in a test swarm); ``extra_p2pd_args`` adds them to the command line
of the p2pd started while it is active (the DHT's, forked with the setting). Nothing else is patched.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from hivemind.p2p import P2P

RelayMode = Literal["auto", "public", "relayed"]
_EXTRA: dict[str, Any] = {}  # set only while a p2pd that needs it is started (see ``extra_p2pd_args``)
_ORIGINAL = P2P._make_process_args


def _with_extra_args(*args: Any, **kwargs: Any) -> list[str]:
    """hivemind's command line, plus ``_EXTRA`` if it is the p2pd they are for: the one whose command line
    has ``_EXTRA["when"]`` (not, e.g., the anonymous p2pd hivemind starts to check an identity)."""
    when = _EXTRA.get("when")
    extra = {k: v for k, v in _EXTRA.items() if k != "when"} if when in kwargs else {}
    return _ORIGINAL(*args, **{**kwargs, **extra})


@dataclass(frozen=True, kw_only=True, slots=True)
class RelayOptions:
    """What p2pd does about relaying; ``auto`` is hivemind's default (p2pd's AutoNAT decides)."""

    mode: RelayMode = "auto"
    """``public``: dialable, relays for others (if ``serve``); ``relayed``: behind a NAT, reached through
    ``trusted_relays``; ``auto``: leave it to p2pd (clients such as ``gwtf status``)."""
    trusted_relays: tuple[str, ...] = ()
    """``relayed``: multiaddrs (with ``/p2p/<id>``) of reachable peers to reserve a relay slot on."""
    serve: bool = True
    """``public``: relay circuits for peers behind NATs (p2pd's relay service)."""
    max_circuits: int = 16
    """Relayed connections open at once per peer that reserved a slot (p2pd's default: 16)."""
    circuit_time_limit_s: float = 6 * 3600.0
    """A relayed connection is reset after this long (p2pd's default: 30 min; the peers reconnect)."""
    circuit_data_limit_bytes: int = 1 << 40
    """... or after this many bytes in one direction (p2pd's default: 4 GiB, minutes of activations)."""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "public", "relayed"):
            raise ValueError(f"relay mode must be auto, public or relayed, got {self.mode!r}")
        if self.mode == "relayed" and not self.trusted_relays:
            raise ValueError("a relayed node needs at least one reachable peer to relay for it")
        if not (isinstance(self.max_circuits, int) and self.max_circuits >= 1):
            raise ValueError(f"max_circuits must be an integer >= 1, got {self.max_circuits!r}")
        if not (math.isfinite(self.circuit_time_limit_s) and self.circuit_time_limit_s >= 1):
            raise ValueError(f"circuit_time_limit_s must be >= 1 s, got {self.circuit_time_limit_s!r}")
        if not (isinstance(self.circuit_data_limit_bytes, int) and self.circuit_data_limit_bytes >= 1 << 20):
            raise ValueError("circuit_data_limit_bytes must be an integer >= 1 MiB")

    def hivemind_kwargs(self) -> dict[str, Any]:
        """Arguments of hivemind's ``DHT``/``P2P.create`` for this mode."""
        if self.mode == "public":
            return {"force_reachability": "public"}
        if self.mode == "relayed":
            return {"force_reachability": "private", "use_auto_relay": True, "use_relay": True,
                    "trusted_relays": list(self.trusted_relays), "client_mode": True}
        return {}

    def extra_args(self) -> dict[str, Any]:
        """p2pd flags hivemind does not pass (``-name=value``), and under ``when`` the flag hivemind sets on
        the p2pd they are for."""
        if self.mode == "public":
            return {"when": "forceReachabilityPublic", "relayService": self.serve,
                    "relayMaxCircuits": self.max_circuits, "relayTimeLimit": f"{int(self.circuit_time_limit_s)}s",
                    "relayDataLimit": self.circuit_data_limit_bytes}
        if self.mode == "relayed":
            return {"when": "trustedRelays", "relayDiscovery": False, "relayService": False}
        return {}


@contextlib.contextmanager
def extra_p2pd_args(options: RelayOptions) -> Iterator[None]:
    """While active, every p2pd this process starts (or forks a starter of) gets ``options.extra_args()``."""
    if P2P._make_process_args is not _with_extra_args:  # type: ignore[comparison-overlap]
        P2P._make_process_args = staticmethod(_with_extra_args)  # type: ignore[method-assign]
    _EXTRA.clear()
    _EXTRA.update(options.extra_args())
    try:
        yield
    finally:
        _EXTRA.clear()
