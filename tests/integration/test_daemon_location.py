"""Link emulation (``--location``, geo10): a local swarm behaves like a geo-distributed one.

A data holder in Frankfurt, stage 1 in London and Sydney, stage 2 in Ireland and Tokyo (each relay
could carry all the flow). Microbatches go through the nearby replicas, and the achieved routing's
cost is within 10% of the oracle's on the same measured costs (as ``gwtf status --json`` reports).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from gwtfp2p.config import RunSpec
from gwtfp2p.ids import short_peer_id
from gwtfp2p.localswarm.processes import FAST, Daemon
from tests.integration.swarm import Swarm
from tests.integration.test_daemon_parity import write_spec
from tests.integration.test_daemon_placement import gwtf_status

pytestmark = pytest.mark.timeout(240)
SCALE = "0.5"


def test_routing_prefers_cheap_replicas_near_oracle(tmp_path: Path) -> None:
    spec = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=5, microbatch_size=2, seq_len=16,
                   microbatches_per_dh=4)
    swarm = Swarm(tmp_path, common=(*FAST, "--log-level", "INFO"))  # INFO: each node's flow units, for a failure
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"),
                                     "--location", "Frankfurt", "--link-scale", SCALE, "--min-nodes", "5")
        placement = {"london": ("1", "London"), "sydney": ("1", "Sydney"), "ireland": ("2", "Ireland"),
                     "tokyo": ("2", "Tokyo")}
        relays = {name: swarm.spawn_relay(name, stage, "--location", where, "--link-scale", SCALE)
                  for name, (stage, where) in placement.items()}
        for relay in relays.values():
            relay.wait_ready()
        start = dh.wait_event("iteration", 90)["iteration"]
        deadline = time.monotonic() + 90
        summary = {}
        while time.monotonic() < deadline:
            last = dh.wait_event("iteration", 90, iteration=start + 5)["iteration"]
            summary = json.loads(gwtf_status(dh.maddr, "--json"))
            flow = summary["flow"]
            if flow["units"] == flow["oracle_units"] == 4 and flow["cost_s"] <= 1.1 * flow["oracle_cost_s"]:
                break
            start = last
        flow = summary["flow"]
        by_peer = {d.peer_id: name for name, d in relays.items()}
        daemons = relays | {"dh0": dh}
        assert flow["units"] == flow["oracle_units"] == 4, routes_by_name(summary, daemons)
        assert flow["cost_s"] <= 1.1 * flow["oracle_cost_s"], routes_by_name(summary, daemons)
        carried = Counter()
        for route in summary["routing"]:
            if route["to"] in by_peer:
                carried[by_peer[route["to"]]] += route["units"]
        assert carried["london"] + carried["ireland"] > carried["sydney"] + carried["tokyo"], carried
        processed = {name: max((e.get("forwards", 0) for e in d.of("progress")), default=0)
                     for name, d in relays.items()}
        assert processed["london"] > processed["sydney"] and processed["ireland"] > processed["tokyo"], processed
    finally:
        swarm.close()


def routes_by_name(summary: dict, daemons: dict[str, Daemon]) -> str:
    """What a failure shows, on one line: the flow, each route (from->to, units, edge cost), how old each
    node's record was when ``gwtf status`` read it, and each node's flow units as it last logged them."""
    now = time.time()
    names = {d.peer_id: name for name, d in daemons.items()}
    routes = [f"{names.get(r['from'], r['from'])}->{names.get(r['to'], r['to'])} x{r['units']} cost "
              f"{'unmeasured' if r['cost_s'] is None else round(r['cost_s'], 3)}" for r in summary["routing"]]
    ages = {names.get(n["peer_id"], n["peer_id"]): round(now - n["updated_at"], 1) for n in summary["nodes"]}
    return json.dumps({"flow": summary["flow"], "routes": routes, "record_age_s": ages,
                       "units": {name: last_units(d, names) for name, d in daemons.items()}})


def last_units(daemon: Daemon, names: dict[str, str]) -> str:
    """The daemon's last ``flow units`` log line, its peers named (``routing.py`` logs them by ``short_peer_id``)."""
    lines = [line for line in daemon.stderr_path.read_text(errors="replace").splitlines() if "flow units at" in line]
    if not lines:
        return "none logged"
    text = lines[-1].split("flow units ", 1)[1]
    for peer, name in names.items():
        text = text.replace(short_peer_id(peer), name)
    return text
