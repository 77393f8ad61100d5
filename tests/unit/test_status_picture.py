"""The routing picture (``gwtf_cli.web.layout`` / ``render``): one box per live replica, one curve per
routed pair (width by units, colour by edge cost), marks for crashed, joining, leaving, relayed and
diverged nodes, unserved stages in red; the SVG is well-formed and the PNG is an image."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gwtf_cli.web.layout import COST_STOPS, cost_color, layout
from gwtf_cli.web.render import to_svg, write_png, write_svg
from gwtf_cli.web.simulated import SimulatedSwarm
from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.status import SwarmSnapshot, summarize
from gwtfp2p.dht.records import LinkStats, NodeRecord, RouteSummary, run_id_of

pytestmark = pytest.mark.timeout(120)
SVG = "{http://www.w3.org/2000/svg}"
SPEC = RunSpec(n_stages=2)
RUN = run_id_of(SPEC)
DH, NEAR, FAR, R2, LATE = ("12D3KooW" + c * 10 for c in "dnfrj")


def node(peer: str, stage: int, routes: tuple[tuple[str, int], ...] = (), **fields) -> NodeRecord:
    links = {to: LinkStats(rtt_s=rtt, bandwidth_bytes_per_s=1e8) for to, rtt in fields.pop("rtts", {}).items()}
    return NodeRecord(run_id=RUN, peer_id=peer, role="data" if stage == 0 else "relay", stage=stage,
                      state=fields.pop("state", "online"), capacity=4, compute_s=0.01, links=links,
                      routing=tuple(RouteSummary(next_peer=to, sink=DH, units=u) for to, u in routes), **fields)


def summary_of(*records: NodeRecord) -> dict:
    return summarize(SwarmSnapshot(RUN, SPEC, {r.peer_id: r for r in records}))


def small_swarm(**extra) -> dict:
    """dh sends 3 units over a cheap link to NEAR, 1 over a dear one to FAR; both to R2, back to dh."""
    return summary_of(
        node(DH, 0, ((NEAR, 3), (FAR, 1)), rtts={NEAR: 0.002, FAR: 0.300}),
        node(NEAR, 1, ((R2, 3),), rtts={R2: 0.01}), node(FAR, 1, ((R2, 1),), rtts={R2: 0.01},
                                                          maddrs=("/ip4/1.2.3.4/tcp/1/p2p/QmRelay1/p2p-circuit",)),
        node(R2, 2, ((DH, 4),), rtts={DH: 0.01}), node(LATE, 2, state="joining"), **extra)


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def test_one_box_per_live_replica_and_one_curve_per_routed_pair():
    summary = small_swarm()
    root = parse(to_svg(layout(summary)))
    boxes = [g for g in root.iter(f"{SVG}g") if "node" in g.get("class", "").split()]
    live = [g.get("data-peer") for g in boxes if "sink" not in g.get("class").split()]
    assert sorted(live) == sorted(n["peer_id"] for n in summary["nodes"])
    assert [g.get("data-peer") for g in boxes if "sink" in g.get("class").split()] == [DH]  # the dh as sink
    curves = {(p.get("data-from"), p.get("data-to")): p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"}
    assert set(curves) == {(r["from"], r["to"]) for r in summary["routing"]}
    assert int(curves[(DH, NEAR)].get("data-units")) == 3 and int(curves[(DH, FAR)].get("data-units")) == 1


def test_width_grows_with_units_and_colour_with_the_edge_cost():
    picture = layout(small_swarm())
    edges = {(e.source, e.target): e for e in picture.edges}
    cheap, dear = edges[(DH, NEAR)], edges[(DH, FAR)]
    assert cheap.cost_s < dear.cost_s
    assert cheap.width < edges[(R2, DH)].width and dear.width < cheap.width
    assert cheap.color == cost_color(0.0) and dear.color == cost_color(1.0)
    assert picture.cost_range_s == (cheap.cost_s, dear.cost_s)


def test_cost_scale_runs_from_green_to_red():
    assert cost_color(0.0) == "#" + "".join(f"{c:02x}" for c in COST_STOPS[0])
    assert cost_color(1.0) == "#" + "".join(f"{c:02x}" for c in COST_STOPS[-1])
    assert cost_color(-5) == cost_color(0.0) and cost_color(7) == cost_color(1.0)


def test_marks_for_joining_relayed_crashed_and_unserved():
    summary = summary_of(node(DH, 0, ((NEAR, 1),), rtts={NEAR: 0.01}),
                         node(NEAR, 1, state="leaving", maddrs=("/ip4/1.2.3.4/tcp/1/p2p/QmRelay1/p2p-circuit",)))
    gone = [{"peer_id": FAR, "role": "relay", "stage": 1, "location": "", "iteration": 4, "at_s": 0.0}]
    picture = layout(summary, gone)
    classes = {n.peer_id: n.classes for n in picture.nodes if "sink" not in n.classes}
    assert {"leaving", "relayed"} <= set(classes[NEAR])
    assert "crashed" in classes[FAR]
    assert next(n for n in picture.nodes if n.peer_id == FAR).lines == ("…" + FAR[-6:] + " ✕", "crashed")
    assert [c.stage for c in picture.columns if c.unserved] == [2]
    root = parse(to_svg(picture))
    unserved = [g for g in root.iter(f"{SVG}g") if g.get("class") == "column unserved"]
    assert [g.get("data-stage") for g in unserved] == ["2"]
    crashed = [g for g in root.iter(f"{SVG}g") if "crashed" in g.get("class", "").split()]
    assert [g.get("data-peer") for g in crashed] == [FAR]
    assert "joining" in {c for n in layout(small_swarm()).nodes for c in n.classes}


def test_a_gone_node_that_is_live_again_is_drawn_once():
    summary = small_swarm()
    gone = [{"peer_id": NEAR, "role": "relay", "stage": 1, "location": "", "iteration": 1, "at_s": 0.0}]
    peers = [n.peer_id for n in layout(summary, gone).nodes if "sink" not in n.classes]
    assert peers.count(NEAR) == 1


def test_diverged_replicas_are_outlined_and_routes_to_unknown_peers_counted():
    summary = small_swarm()
    summary["nodes"][0] = {**summary["nodes"][0], "sync": "diverged"}
    summary["routing"].append({"from": DH, "to": "12D3KooW" + "z" * 10, "sink": DH, "units": 1, "rtt_ms": None,
                               "cost_s": None})
    picture = layout(summary)
    first = next(n for n in picture.nodes if n.peer_id == summary["nodes"][0]["peer_id"])
    assert "diverged" in first.classes and first.stroke == "#dc2626"
    assert picture.dangling_routes == 1


def test_text_from_records_is_escaped():
    summary = small_swarm()
    summary["spec"] = {**summary["spec"], "model_preset": "<script>&"}
    svg = to_svg(layout(summary))
    parse(svg)  # well-formed
    assert "<script>" not in svg and "&lt;script&gt;&amp;" in svg


def test_files(tmp_path: Path):
    summary = SimulatedSwarm(30, seed=3).summary()
    write_svg(summary, tmp_path / "r.svg")
    root = parse((tmp_path / "r.svg").read_text())
    live = [g for g in root.iter(f"{SVG}g") if "node" in g.get("class", "").split()
            and "sink" not in g.get("class").split()]
    assert len(live) == 30
    write_png(summary, tmp_path / "r.png")
    data = (tmp_path / "r.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
