"""A relay behind a NAT serves through a relay, survives its home network going down, and re-syncs (issue 13).

Real network stacks in namespaces (``tests/integration/netns``): a data holder and a relay on the
"internet", a second relay of the same stage behind an iptables MASQUERADE router that drops every
connection started from outside. The run has one stage, so both relays are replicas of it.

1. The NAT'd relay's reachability check says ``relayed`` (its peers could not dial it back), the public
   relay's ``direct``; the swarm trains 20 iterations, microbatches go through the NAT'd relay and both
   replicas step with one hash.
2. The NAT'd relay's link goes down for 60 s: the swarm trains on through the public relay without
   losing a microbatch; the NAT'd relay declares an outage, redials, and when the link is back re-syncs
   its state (it was cut off) and serves again without a restart; the replicas end with one hash.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from tests.integration.netns.topology import Topology
from tests.integration.swarm import Daemon, Swarm

pytestmark = pytest.mark.timeout(600)
ONE_STAGE = {"model_family": "gpt2", "model_preset": "tiny", "n_stages": 1, "seed": 5, "lr": 3e-3,
             "microbatch_size": 2, "seq_len": 32, "microbatches_per_dh": 4}
OUTAGE_S = 60.0


def hashes(relay: Daemon) -> dict[int, str]:
    return {e["iteration"]: e["hash"] for e in relay.of("step")}


def forwards(relay: Daemon) -> int:
    progress = relay.of("progress")
    return progress[-1].get("forwards", 0) if progress else 0


def in_sync(a: Daemon, b: Daemon, since: int = 0) -> tuple[int, list[int]]:
    """(iterations both stepped since ``since``, those where their hashes differ)."""
    ha, hb = hashes(a), hashes(b)
    common = sorted(i for i in set(ha) & set(hb) if i >= since)
    return len(common), [i for i in common if ha[i] != hb[i]]


def test_a_relay_behind_nat_trains_through_a_relay_and_comes_back_from_an_outage(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(ONE_STAGE))
    with Topology() as topo:
        dh_host, pub_host, home_host = topo.public_host("dh"), topo.public_host("pub"), topo.home_host("home")
        swarm = Swarm(tmp_path)
        try:
            dh = swarm.spawn("dh", "--role", "data", "--host", "0.0.0.0", "--port", "4000", "--run-spec", str(spec),
                             "--min-nodes", "3", env={"GWTF_NETNS": dh_host.netns}).wait_ready()
            bootstrap = next(m for m in dh.ready["maddrs"] if dh_host.address in m)
            common = ("--stage", "1", "--host", "0.0.0.0", "--initial-peers", bootstrap)
            # the public relay holds 2 of the data holder's 4 microbatches: the flow needs the NAT'd one too
            pub = swarm.spawn("pub", *common, "--port", "4001", "--capacity", "2", env={"GWTF_NETNS": pub_host.netns})
            home = swarm.spawn("home", *common, "--port", "4002", env={"GWTF_NETNS": home_host.netns})
            pub.wait_ready(), home.wait_ready()

            # the NAT drops what starts outside: the public relay cannot open a connection to home's port
            assert pub_host.run("python3", "-c", _CONNECT.format(host=home_host.router_wan, port=4002),
                                check=False).stdout.strip() in ("refused", "timeout")
            assert home.of("reachability")[0]["verdict"] == "relayed"
            assert pub.of("reachability")[0]["verdict"] == "direct"
            assert any("/p2p-circuit/" in m for m in home.ready["maddrs"])

            twentieth = dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= 19, 240,
                                    "20 iterations")
            # progress events come once per heartbeat: the first one after the 20th iteration counts its forwards
            after = home.wait_for(lambda e: e.get("event") == "progress" and e["time"] >= twentieth["time"], 30,
                                  "a progress event after the 20 iterations")
            assert after.get("forwards", 0) > 0, "no microbatch went through the NAT'd relay"
            stepped, diverged = in_sync(pub, home)
            assert stepped >= 15 and not diverged

            # phase 2: home's network is down for a minute
            before = forwards(home)
            topo.link_down("home")
            down_at = time.time()
            time.sleep(OUTAGE_S)  # the scenario itself: a minute offline
            topo.link_up("home")
            outage = home.wait_event("outage", 10)
            assert outage["time"] - down_at < 20
            resynced = home.wait_event("resynced", 240)
            home.wait_for(lambda e: e.get("event") == "step" and e["iteration"] >= resynced["iteration"] + 5, 180,
                          "5 steps after the re-sync")
            home.wait_for(lambda e: e.get("event") == "progress" and e.get("forwards", 0) > before, 120,
                          "forwards after the outage")
            stepped, diverged = in_sync(pub, home, since=resynced["iteration"])
            assert stepped >= 5 and not diverged, _steps_around(pub, home, resynced["iteration"])
            assert len(home.of("ready")) == 1 and home.popen.poll() is None  # no restart
            assert all(e["lost_microbatches"] == 0 for e in dh.of("iteration"))
            print(f"outage declared {outage['time'] - down_at:.1f} s after the link went down; re-synced "
                  f"{resynced['time'] - down_at - OUTAGE_S:.1f} s after it came back (iteration "
                  f"{resynced['iteration']}, {resynced['replayed_steps']} steps replayed)")
        finally:
            swarm.close()


def _steps_around(pub: Daemon, home: Daemon, iteration: int) -> str:
    """The replicas' steps around the re-sync and home's outage events (what a failure needs to be read)."""
    keys = ("iteration", "hash", "count", "members", "agreement", "dropped", "own_count")
    window = range(iteration - 1, iteration + 7)
    near = [(d.name, [{k: e.get(k) for k in keys} for e in d.of("step") if e["iteration"] in window])
            for d in (pub, home)]
    marks = [e for e in home.events if e.get("event") in ("resync", "resynced", "outage", "reconnected")]
    return "\n".join([*(f"{name}: {steps}" for name, steps in near), f"home: {marks}"])


_CONNECT = ("import socket; s = socket.socket(); s.settimeout(3)\n"
            "try:\n s.connect(('{host}', {port})); print('open')\n"
            "except socket.timeout: print('timeout')\n"
            "except ConnectionRefusedError: print('refused')")
assert socket  # the child runs the snippet above
