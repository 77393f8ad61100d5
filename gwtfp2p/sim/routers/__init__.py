"""Routers compared by the simulator: ``gwtf`` (FlowNode protocol), ``swarm`` and ``oracle``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gwtfp2p.sim.params import check_router
from gwtfp2p.sim.routers.base import Router
from gwtfp2p.sim.routers.gwtf import GwtfRouter
from gwtfp2p.sim.routers.oracle import OracleRouter
from gwtfp2p.sim.routers.swarm import SwarmRouter

if TYPE_CHECKING:
    from gwtfp2p.sim.simulation import Simulation

ROUTER_CLASSES: dict[str, type[Router]] = {"gwtf": GwtfRouter, "swarm": SwarmRouter, "oracle": OracleRouter}


def make_router(name: str, sim: Simulation) -> Router:
    return ROUTER_CLASSES[check_router(name)](sim)


__all__ = ["ROUTER_CLASSES", "Router", "make_router"]
