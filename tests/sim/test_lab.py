"""The ``lab`` network, measured per-stage compute and the daemon's own model in the simulator."""

from __future__ import annotations

import pytest

from gwtfp2p.config import ConfigError
from gwtfp2p.sim.compute import MODELS, stage_param_count
from gwtfp2p.sim.network import MBIT, Network, NetworkSpec
from gwtfp2p.sim.params import Scenario
from gwtfp2p.sim.simulation import Simulation

pytestmark = pytest.mark.timeout(60)
SIZE = 2**20


def lab_network(uplink_mbit: float = 50.0, latency_s: float = 0.001) -> Network:
    spec = NetworkSpec("lab", uniform_latency_s=latency_s, lab_uplink_mbit=uplink_mbit)
    net = Network(spec)
    for node in ("a", "b", "c"):
        net.add_node(node, "anywhere", spec.draw_access(None))  # lab nodes draw nothing
    return net


def test_lab_links_are_the_senders_uplink_and_the_uniform_latency():
    net = lab_network(uplink_mbit=10.0)
    assert net.link("a", "b") == pytest.approx((0.001, 10 * MBIT))
    assert net.spec.shared_uplink


def test_lab_uploads_share_one_uplink_and_downloads_do_not():
    net = lab_network()
    serialize = SIZE / (50 * MBIT)
    _, depart1, arrive1 = net.transfer("a", "b", SIZE, 0.0)
    assert (depart1, arrive1) == pytest.approx((serialize, serialize + 0.001))
    start2, depart2, _ = net.transfer("a", "c", SIZE, 0.0)  # another destination, the same uplink
    assert (start2, depart2) == pytest.approx((serialize, 2 * serialize))
    start3, _, _ = net.transfer("c", "b", SIZE, 0.0)  # b's downlink is not capped: c's upload starts at once
    assert start3 == 0.0


def test_lab_uplink_must_be_positive_and_finite():
    for bad in (0.0, -5.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="lab uplink"):
            NetworkSpec("lab", lab_uplink_mbit=bad)


def test_the_daemons_model_sends_float32_and_int64_sums_under_none():
    model = MODELS["gpt2-small"]
    assert model.activation_bytes == 8 * 256 * 128 * 4  # 1 MiB a hop and direction, as the daemon counts
    stage = stage_param_count(model, 1, 2)
    assert stage == 3 * (4 * 128 * 128 + 2 * 128 * 512 + 9 * 128 + 512)
    assert model.grad_bytes(stage) == 8 * stage
    assert MODELS["llama500m"].grad_bytes(1000) == 2000  # the simulated GPUs' all-reduce stays bf16


def lab_scenario(**overrides) -> Scenario:
    fields = dict(name="lab-test", model="gpt2-small", n_stages=2, relays_per_stage=2, data_holders=1,
                  microbatches_per_dh=4, network=NetworkSpec("lab", uniform_latency_s=0.001, lab_uplink_mbit=10.0),
                  target_microbatches=40, horizon_s=3600.0, max_slots=2, flow_tick_s=0.25,
                  stage_compute_s=(0.01, 0.2, 0.3))
    fields.update(overrides)
    return Scenario(**fields)


def test_measured_stage_compute_replaces_the_gpu_model():
    sim = Simulation(lab_scenario(), seed=0, router="gwtf")
    for plan in sim.trace.initial:
        node = sim.compute_of(plan)
        measured = (0.01, 0.2, 0.3)[plan.stage]
        assert (node.forward_s, node.backward_s) == pytest.approx((measured / 3, 2 * measured / 3))
        assert plan.is_data_holder or node.slots == 2  # memory (capped) still sets the slots


@pytest.mark.parametrize("bad", [(0.1, 0.2), (0.1, 0.0, 0.2), (0.1, float("nan"), 0.2)])
def test_stage_compute_needs_one_positive_figure_per_stage(bad):
    with pytest.raises(ConfigError, match="--stage-compute-s"):
        lab_scenario(stage_compute_s=bad)


def test_a_link_bound_lab_swarm_runs_at_its_uplinks_pace():
    """At 10 Mbit/s an iteration is at least the data holder's uplink (4 forwards and 4 gradients of 1 MiB)
    and then the relays' all-reduce (each uploads its 4.76 MB of int64 sums); blockwise8 sends 3.88x fewer
    bytes a hop and 7.76x fewer in the all-reduce, and its speed-up falls between the two."""
    times = {}
    for codec in ("none", "blockwise8"):
        sim = Simulation(lab_scenario(codec=codec), seed=0, router="gwtf")
        result = sim.run()
        assert result.summary.completed >= 40
        times[codec] = result.summary.median_iteration_s
    assert times["none"] >= (8 * 2**20 + 4_758_528) / (10 * MBIT)
    assert 3.88 < times["none"] / times["blockwise8"] < 7.76


def test_each_iterations_aggregation_begins_inside_it_after_its_microbatches():
    """``Metrics.aggregations``: when an iteration's last microbatch came back. At 10 Mbit/s the relays'
    all-reduce (each uploads its 4.76 MB of int64 sums to its stage peer) takes at least its upload."""
    sim = Simulation(lab_scenario(), seed=0, router="gwtf")
    sim.run()
    assert sim.metrics.iterations
    for index, start, end in sim.metrics.iterations:
        began = sim.metrics.aggregations[index]
        assert start < began < end
        assert end - began >= 4_758_528 / 2 / (10 * MBIT)  # a butterfly: half the sums each way at least
