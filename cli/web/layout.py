"""Where everything of the routing picture goes: columns, nodes, edges, colours, as plain data.

Columns are the data holders, the stages 1..S, and the data holders again as the sinks the last
stage returns to; each live replica is one box (marked joining, leaving, relayed, crashed, or by
its sync state), each routed pair one curve whose width grows with its flow units and whose
colour goes from green (the cheapest routed edge) to red (the dearest). ``render`` paints it; this
module only decides geometry and style from a ``gwtf status --json`` summary. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gwtfp2p.ids import short_peer_id as short

COLUMN_W = 200
NODE_W = 140
NODE_H = 38
ROW_H = 48
MARGIN = 20
HEADER_H = 64
LEGEND_H = 92
MIN_PICTURE_W = 760  # room for the legend
MIN_WIDTH_PX, MAX_WIDTH_PX = 1.5, 10.0  # edge widths for the fewest and the most units
COST_STOPS = ((0x16, 0xA3, 0x4A), (0xEA, 0xB3, 0x08), (0xDC, 0x26, 0x26))  # cheap → dear
UNKNOWN_COST = "#9ca3af"
FILL = {"data": "#d1fae5", "relay": "#dbeafe", "joining": "#fef9c3", "leaving": "#e5e7eb", "crashed": "#fee2e2"}
STROKE = {"diverged": "#dc2626", "lagging": "#f59e0b", "unverified": "#6b7280"}


@dataclass(frozen=True, slots=True)
class Column:
    index: int
    stage: int
    title: str
    x: float
    unserved: bool


@dataclass(frozen=True, slots=True)
class NodeBox:
    peer_id: str
    stage: int
    x: float
    y: float
    classes: tuple[str, ...]  # role, state, and marks: crashed, relayed, diverged, lagging, unverified, sink
    fill: str
    stroke: str
    stroke_w: float
    dashed: bool
    lines: tuple[str, str]
    tooltip: str


@dataclass(frozen=True, slots=True)
class EdgeCurve:
    source: str
    target: str
    units: int
    cost_s: float | None
    points: tuple[tuple[float, float], ...]  # cubic Bézier: start, control, control, end
    width: float
    color: str
    tooltip: str


@dataclass(frozen=True, slots=True)
class Picture:
    width: float
    height: float
    title: str
    subtitle: str
    columns: tuple[Column, ...]
    nodes: tuple[NodeBox, ...]
    edges: tuple[EdgeCurve, ...]
    cost_range_s: tuple[float, float] | None
    max_units: int
    dangling_routes: int  # routed pairs whose end is neither a live node nor a crashed one


def cost_color(fraction: float) -> str:
    """Hex colour at ``fraction`` (0 cheapest … 1 dearest) of the green → amber → red scale."""
    f = min(1.0, max(0.0, fraction)) * (len(COST_STOPS) - 1)
    i = min(int(f), len(COST_STOPS) - 2)
    a, b = COST_STOPS[i], COST_STOPS[i + 1]
    return "#" + "".join(f"{round(x + (y - x) * (f - i)):02x}" for x, y in zip(a, b, strict=True))


def _box(node: dict[str, Any], x: float, y: float, crashed: bool, sink: bool) -> NodeBox:
    state = "crashed" if crashed else node["state"]
    sync = node.get("sync", "no_hash")
    marks = [node["role"], state] + (["relayed"] if node.get("relayed") else [])
    if sync in STROKE and not crashed:
        marks.append(sync)
    if sink:
        marks.append("sink")
    fill = FILL[state] if state in FILL else FILL[node["role"]]
    stroke = "#dc2626" if crashed else STROKE.get(sync, "#1f2937")
    detail = {"crashed": "crashed", "joining": "joining", "leaving": "leaving"}.get(state, f"it {node['iteration']}")
    detail += " · relayed" if node.get("relayed") else ""
    detail += f" · {sync}" if sync in STROKE and not crashed else ""
    where = f" in {node['location']}" if node.get("location") else ""
    tooltip = (f"{node['peer_id']}\n{node['role']} stage {node['stage']}{where}, {state}, sync: {sync}\n"
               f"iteration {node['iteration']}, capacity {node.get('capacity', '-')}, "
               f"hash {node.get('hash') or '-'}")
    return NodeBox(node["peer_id"], node["stage"], x, y, tuple(marks), fill, stroke,
                   2.5 if (crashed or sync in STROKE) else 1.0, crashed or bool(node.get("relayed")) or sink,
                   (short(node["peer_id"]) + (" ✕" if crashed else ""), detail), tooltip)


def _pairs(routing: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for route in routing:
        key = (route["from"], route["to"])
        entry = pairs.setdefault(key, {"units": 0, "cost_s": route.get("cost_s"), "rtt_ms": route.get("rtt_ms")})
        entry["units"] += route["units"]
    return pairs


def layout(summary: dict[str, Any], gone: list[dict[str, Any]] = ()) -> Picture:
    """The picture of ``summary`` (a ``gwtf status --json`` object); ``gone``: crashed nodes to mark."""
    n_stages = summary["spec"]["n_stages"]
    unserved = set(summary["unserved_stages"])
    columns = [Column(0, 0, "data holders", MARGIN, False)]
    columns += [Column(k, k, f"stage {k}", MARGIN + k * COLUMN_W, k in unserved) for k in range(1, n_stages + 1)]
    columns.append(Column(n_stages + 1, 0, "data holders (sinks)", MARGIN + (n_stages + 1) * COLUMN_W, False))
    live = {n["peer_id"] for n in summary["nodes"]}
    entries = [(n, False) for n in summary["nodes"] if n["stage"] <= n_stages]
    entries += [({**g, "state": "crashed", "capacity": "-", "hash": ""}, True)
                for g in gone if g["peer_id"] not in live]
    rows: dict[int, int] = {}
    boxes: dict[str, NodeBox] = {}
    sinks: dict[str, NodeBox] = {}
    for node, crashed in sorted(entries, key=lambda e: (e[1], e[0]["peer_id"])):
        row = rows.get(node["stage"], 0)
        rows[node["stage"]] = row + 1
        y = HEADER_H + row * ROW_H
        boxes[node["peer_id"]] = _box(node, MARGIN + node["stage"] * COLUMN_W, y, crashed, sink=False)
        if node["stage"] == 0:
            sinks[node["peer_id"]] = _box(node, columns[-1].x, y, crashed, sink=True)
    edges, dangling = _edges(_pairs(summary["routing"]), boxes, sinks, n_stages)
    costs = [e.cost_s for e in edges if e.cost_s is not None]
    height = HEADER_H + max(1, max(rows.values(), default=1)) * ROW_H + LEGEND_H
    flow, spec = summary["flow"], summary["spec"]
    oracle = f" (oracle {flow['oracle_units']})" if flow.get("oracle_units") is not None else ""
    return Picture(
        width=max(MIN_PICTURE_W, 2 * MARGIN + (n_stages + 1) * COLUMN_W + NODE_W), height=height,
        title=f"run {summary['run_id']} · {spec['model_family']}-{spec['model_preset']} · iteration "
              f"{summary['iteration']}",
        subtitle=f"flow {flow['units']} unit(s){oracle} · {len(summary['nodes'])} node(s) · "
                 f"{'replicas in sync' if summary['replicas_in_sync'] else 'replicas NOT in sync'}",
        columns=tuple(columns), nodes=tuple(boxes.values()) + tuple(sinks.values()), edges=tuple(edges),
        cost_range_s=(min(costs), max(costs)) if costs else None,
        max_units=max((e.units for e in edges), default=0), dangling_routes=dangling)


def _edges(pairs: dict[tuple[str, str], dict[str, Any]], boxes: dict[str, NodeBox], sinks: dict[str, NodeBox],
           n_stages: int) -> tuple[list[EdgeCurve], int]:
    costs = [p["cost_s"] for p in pairs.values() if p["cost_s"] is not None]
    low, high = (min(costs), max(costs)) if costs else (0.0, 0.0)
    most = max((p["units"] for p in pairs.values()), default=1) or 1
    edges, dangling = [], 0
    for (a, b), pair in sorted(pairs.items()):
        source = boxes.get(a)
        target = sinks.get(b) if source is not None and source.stage == n_stages else boxes.get(b)
        if source is None or target is None:
            dangling += 1
            continue
        x1, y1 = source.x + NODE_W, source.y + NODE_H / 2
        x2, y2 = target.x, target.y + NODE_H / 2
        bend = max(30.0, (x2 - x1) / 2)
        cost = pair["cost_s"]
        color = UNKNOWN_COST if cost is None else cost_color((cost - low) / (high - low) if high > low else 0.5)
        rtt = f", RTT {pair['rtt_ms']:.1f} ms" if pair["rtt_ms"] is not None else ""
        cost_text = "unmeasured" if cost is None else f"{cost * 1000:.1f} ms"
        edges.append(EdgeCurve(a, b, pair["units"], cost, ((x1, y1), (x1 + bend, y1), (x2 - bend, y2), (x2, y2)),
                               MIN_WIDTH_PX + (MAX_WIDTH_PX - MIN_WIDTH_PX) * pair["units"] / most, color,
                               f"{short(a)} → {short(b)}: {pair['units']} unit(s), edge cost {cost_text}{rtt}"))
    return edges, dangling
