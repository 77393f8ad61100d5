"""The flow's uplink model wired into the simulator: resources per node, for gwtf and the oracle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gwtfp2p.sim.network import NetworkSpec
from gwtfp2p.sim.simulation import Simulation
from tests.sim.conftest import small

pytestmark = pytest.mark.timeout(60)


def started(network: str, router: str = "gwtf", **overrides) -> Simulation:
    sim = Simulation(small(network=NetworkSpec(network), target_microbatches=10_000, **overrides), 0, router)
    sim.start()
    return sim


def test_home_nodes_price_their_shared_uplink_and_geo10_nodes_do_not():
    home, geo = started("home"), started("geo10")
    size = home.model.activation_bytes
    for node in home.cluster.nodes.values():
        uplink = home.network.access[node.node_id][0]
        resources = home.resources_of(node)
        assert resources.uplink_s_per_unit == pytest.approx(2 * size / uplink)  # activations out, gradients back
        assert resources.compute_s_per_unit == pytest.approx(node.forward_s + node.backward_s)
        assert home.router.flows[node.node_id].core.resources == resources
    assert all(geo.resources_of(n).uplink_s_per_unit == 0 for n in geo.cluster.nodes.values())
    flat = started("home", flow_uplink_aware=False)
    assert all(flat.resources_of(n).uplink_s_per_unit == 0 for n in flat.cluster.nodes.values())


def test_the_oracle_solves_the_same_model():
    sim = started("home", "oracle")
    instance = sim.flow_instance()
    assert all(spec.uplink_s_per_unit == sim.resources_of(sim.cluster.nodes[spec.node_id]).uplink_s_per_unit
               for spec in instance.nodes)
    budget = started("home", "oracle", flow_iteration_budget_s=8.0)
    for spec in budget.flow_instance().nodes:
        node = budget.cluster.nodes[spec.node_id]
        if not node.is_data_holder:
            assert spec.capacity == budget.resources_of(node).capacity(node.slots, 8.0) <= node.slots


def test_a_budget_binds_the_flow_nodes_capacity():
    sim = started("home", flow_iteration_budget_s=8.0)
    tight = [n for n in sim.cluster.nodes.values()
             if not n.is_data_holder and sim.resources_of(n).capacity(n.slots, 8.0) < n.slots]
    assert tight  # a 20 Mbit/s uplink sends two 8 MiB transfers in 6.7 s: at most one unit in 8 s
    for node in tight:
        assert sim.router.flows[node.node_id].core.capacity == sim.resources_of(node).capacity(node.slots, 8.0)
    assert replace(sim.scenario, flow_iteration_budget_s=0.0).flow_params().iteration_budget_s == 0.0
