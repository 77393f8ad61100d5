"""A run started through a stock ``hivemind-dht`` bootstrap, each node in its own network namespace (issue 13).

The usual way to run a stable public bootstrap is hivemind's own ``hivemind-dht``, which knows nothing of
gwtf. ``gwtf join --role data --new-run`` starts a run through it; a relay that knows only the bootstrap
finds the run in the DHT (its reachability check asks the data holder, found in the records, to dial it
back) and they train.
"""

from __future__ import annotations

import json
import select
import subprocess
import time
from pathlib import Path

import pytest

from gwtfp2p.dht.identity import NodeKey
from gwtfp2p.dht.identity_file import write_new_key
from tests.integration.netns.topology import Host, Topology
from tests.integration.swarm import REPO_ROOT, Swarm

pytestmark = pytest.mark.timeout(360)
ONE_STAGE = {"model_family": "gpt2", "model_preset": "tiny", "n_stages": 1, "seed": 7, "microbatch_size": 2,
             "seq_len": 16, "microbatches_per_dh": 2}
BOOT_PORT = 4100


def start_stock_bootstrap(host: Host, key: Path, timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """``hivemind-dht`` in ``host``'s namespace; its multiaddr once it logs that it runs."""
    write_new_key(key)
    command = host.exec_args(str(REPO_ROOT / ".venv" / "bin" / "hivemind-dht"), "--host_maddrs",
                             f"/ip4/0.0.0.0/tcp/{BOOT_PORT}", "--identity_path", str(key))
    boot = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readable, _, _ = select.select([boot.stderr], [], [], 1.0)
        line = boot.stderr.readline() if readable else ""
        if "Running a DHT instance" in line:
            return boot, f"/ip4/{host.address}/tcp/{BOOT_PORT}/p2p/{NodeKey.load(key).peer_id}"
        if boot.poll() is not None:
            raise RuntimeError(f"hivemind-dht exited with {boot.returncode}")
    boot.kill()
    raise TimeoutError("hivemind-dht did not start")


def test_a_data_holder_starts_a_run_through_a_stock_hivemind_dht_and_a_relay_joins_it(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(ONE_STAGE))
    with Topology() as topo:
        boot_host, dh_host, relay_host = topo.public_host("boot"), topo.public_host("dh"), topo.public_host("relay")
        boot, bootstrap = start_stock_bootstrap(boot_host, tmp_path / "boot.key")
        swarm = Swarm(tmp_path)
        try:
            dh = swarm.spawn("dh", "--role", "data", "--new-run", "--run-spec", str(spec), "--initial-peers",
                             bootstrap, "--host", "0.0.0.0", "--min-nodes", "2",
                             env={"GWTF_NETNS": dh_host.netns}).wait_ready()
            assert dh.of("reachability")[0]["verdict"] == "unknown"  # no gwtf node to check it yet
            relay = swarm.spawn("relay", "--stage", "1", "--initial-peers", bootstrap, "--host", "0.0.0.0",
                                env={"GWTF_NETNS": relay_host.netns}).wait_ready()
            assert relay.ready["run_id"] == dh.ready["run_id"]
            assert relay.of("reachability")[0]["verdict"] == "direct"  # the data holder dialled it back
            last = dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= 4, 180, "5 iterations")
            assert last["lost_microbatches"] == 0 and relay.of("step")
        finally:
            swarm.close()
            boot.kill()
            boot.wait(timeout=30)
