"""Routers on the shared data plane: ``gwtf`` (the FlowNode protocol) and the ``oracle``.

SWARM does not route on the shared data plane: its trainers call stateless servers themselves
(``gwtfp2p.sim.swarm``).
"""

from __future__ import annotations

from gwtfp2p.config import ConfigError
from gwtfp2p.sim.ports import RouterHost
from gwtfp2p.sim.routers.base import Router
from gwtfp2p.sim.routers.gwtf import GwtfRouter
from gwtfp2p.sim.routers.oracle import OracleRouter

ROUTER_CLASSES: dict[str, type[Router]] = {"gwtf": GwtfRouter, "oracle": OracleRouter}


def make_router(name: str, sim: RouterHost) -> Router:
    if name not in ROUTER_CLASSES:
        raise ConfigError(f"--router: {name!r} does not route on the shared data plane; "
                          f"use one of {', '.join(ROUTER_CLASSES)}")
    return ROUTER_CLASSES[name](sim)


__all__ = ["ROUTER_CLASSES", "Router", "make_router"]
