"""gwtfp2p.dht: versioned wire records and the asyncio facade over hivemind's DHT (docs/architecture.md).

``records`` holds the pydantic records (no hivemind); ``swarm_dht`` is the only module that talks to
``hivemind.DHT``. Names from ``swarm_dht``/``hivemind_log`` are imported lazily, so that reading
records (``gwtf status``, tests) does not pay hivemind's ≈3 s import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gwtfp2p.dht.errors import BootstrapError, DHTClosed, DHTError, DHTStartError, DHTTimeout
from gwtfp2p.dht.records import (
    MAX_LINKS,
    MAX_ROUTES,
    LinkStats,
    NodeRecord,
    RecordError,
    RouteSummary,
    RunSpecRecord,
    encode_record,
    parse_node_record,
    parse_run_spec_record,
    run_id_of,
)

if TYPE_CHECKING:
    from gwtfp2p.dht.hivemind_log import route_hivemind_logs
    from gwtfp2p.dht.swarm_dht import CURRENT_RUN_KEY, SwarmDHT, nodes_key, spec_key

_LAZY = {"SwarmDHT": "swarm_dht", "CURRENT_RUN_KEY": "swarm_dht", "nodes_key": "swarm_dht",
         "spec_key": "swarm_dht", "route_hivemind_logs": "hivemind_log"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"gwtfp2p.dht.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'gwtfp2p.dht' has no attribute {name!r}")


__all__ = [
    "CURRENT_RUN_KEY",
    "MAX_LINKS",
    "MAX_ROUTES",
    "BootstrapError",
    "DHTClosed",
    "DHTError",
    "DHTStartError",
    "DHTTimeout",
    "LinkStats",
    "NodeRecord",
    "RecordError",
    "RouteSummary",
    "RunSpecRecord",
    "SwarmDHT",
    "encode_record",
    "nodes_key",
    "parse_node_record",
    "parse_run_spec_record",
    "route_hivemind_logs",
    "run_id_of",
    "spec_key",
]
