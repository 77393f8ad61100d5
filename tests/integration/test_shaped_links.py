"""Rate-limited links for real: nodes in network namespaces whose uplinks ``tc tbf`` caps in the kernel.

1. The cap holds: 2 MiB from a host capped at 8 Mbit/s arrive at 5.5-8.8 Mbit/s; the other way (uncapped)
   at least 3 times as fast.
2. A swarm (data holder, one relay per stage, namespaces prefixed ``bw16``) trains on 20 Mbit/s uplinks
   with blockwise8 on the wire: every iteration completes, the bytes per microbatch per hop are the codec's
   exact size, and the data holder's link sent at least what its daemon counted (the tensors crossed the
   shaped veths, the direct data channel's TCP or libp2p's).
Everything is removed at the end, on failure too (``Topology``).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from gwtfp2p.config import encoded_bytes
from gwtfp2p.localswarm.wire_figures import bytes_per_microbatch_hop, swarm_traffic
from tests.integration.netns.rate import transfer_mbit, tx_bytes
from tests.integration.netns.topology import Topology
from tests.integration.swarm import Swarm

pytestmark = pytest.mark.timeout(420)
SPEC = {"model_family": "gpt2", "model_preset": "tiny", "n_stages": 2, "seed": 3, "lr": 3e-3, "microbatch_size": 4,
        "seq_len": 64, "microbatches_per_dh": 4, "forward_codec": "blockwise8", "backward_codec": "blockwise8",
        "aggregate_codec": "blockwise8"}
ITERATIONS = 4
HIDDEN = 32  # the tiny preset


def topology() -> Topology:
    return Topology(prefix=f"bw16{uuid.uuid4().hex[:5]}")


def test_tbf_caps_the_uplink() -> None:
    with topology() as topo:
        topo.public_host("a"), topo.public_host("b")
        topo.shape("a", "8mbit")
        capped = transfer_mbit(topo, "a", "b", 2 * 2**20)
        free = transfer_mbit(topo, "b", "a", 2 * 2**20)
    assert 5.5 <= capped <= 8.8, capped
    assert free > 3 * capped, (free, capped)


def test_a_swarm_trains_on_shaped_uplinks(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    with topology() as topo:
        for name in ("dh", "r1", "r2"):
            topo.public_host(name)
            topo.shape(name, "20mbit")
        sent_before = tx_bytes(topo, "dh")
        swarm = Swarm(tmp_path)
        try:
            dh = swarm.spawn("dh", "--role", "data", "--host", "0.0.0.0", "--port", "4000", "--run-spec", str(spec),
                             "--min-nodes", "3", "--max-iterations", str(ITERATIONS),
                             env={"GWTF_NETNS": topo.hosts["dh"].netns}).wait_ready()
            bootstrap = next(m for m in dh.ready["maddrs"] if topo.hosts["dh"].address in m)
            relays = [swarm.spawn(name, "--stage", stage, "--host", "0.0.0.0", "--port", "4001", "--initial-peers",
                                  bootstrap, env={"GWTF_NETNS": topo.hosts[name].netns})
                      for name, stage in (("r1", "1"), ("r2", "2"))]
            for relay in relays:
                relay.wait_ready()
            dh.wait_event("training_done", 300)
            losses = [e["loss"] for e in dh.of("iteration")]
            traffic = swarm_traffic(swarm.daemons, dh.of("iteration")[-1]["time"])
            dh_traffic = swarm_traffic([dh], dh.of("iteration")[-1]["time"])
        finally:
            swarm.close()
        link_sent = tx_bytes(topo, "dh") - sent_before
    assert len(losses) == ITERATIONS and all(0 < loss < 10 for loss in losses)
    values = SPEC["microbatch_size"] * SPEC["seq_len"] * HIDDEN
    assert bytes_per_microbatch_hop(traffic) == 2 * encoded_bytes("blockwise8", values, 4)
    assert link_sent >= dh_traffic["forward_bytes"] + dh_traffic["backward_bytes"] > 0
