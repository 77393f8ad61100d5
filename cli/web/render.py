"""Paints a routing ``Picture`` (``layout``) as a self-contained SVG document or as a PNG file.

The SVG is what ``gwtf status --svg`` writes and what the live page shows: every live replica is a
``<g class="node …" data-peer=…>``, every routed pair a ``<path class="edge" data-from data-to>``,
with a ``<title>`` tooltip each. The PNG is drawn from the same picture with matplotlib (Agg).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from gwtf_cli.web.layout import (
    COST_STOPS,
    HEADER_H,
    MARGIN,
    NODE_H,
    NODE_W,
    Picture,
    cost_color,
    layout,
)

STYLE = """
svg.gwtf-routing { font-family: ui-sans-serif, system-ui, sans-serif; background: #ffffff; }
svg.gwtf-routing .title { font-size: 15px; font-weight: 600; fill: #111827; }
svg.gwtf-routing .subtitle, svg.gwtf-routing .legend text { font-size: 11px; fill: #374151; }
svg.gwtf-routing .column text { font-size: 12px; font-weight: 600; fill: #374151; }
svg.gwtf-routing .column.unserved text { fill: #dc2626; }
svg.gwtf-routing .node text { font-family: ui-monospace, monospace; font-size: 11px; fill: #111827; }
svg.gwtf-routing .node .detail { font-size: 10px; fill: #4b5563; }
svg.gwtf-routing .edge { fill: none; stroke-opacity: 0.8; }
svg.gwtf-routing .edge:hover { stroke-opacity: 1; }
svg.gwtf-routing .sink { opacity: 0.55; }
"""


def _f(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def to_svg(picture: Picture, version: int | None = None) -> str:
    """The picture as one SVG document (UTF-8 text)."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="gwtf-routing" width="{_f(picture.width)}" '
           f'height="{_f(picture.height)}" viewBox="0 0 {_f(picture.width)} {_f(picture.height)}"'
           + (f' data-version="{version}"' if version is not None else "") + ">",
           f"<style>{STYLE}</style>",
           '<rect width="100%" height="100%" fill="#ffffff"/>',
           f'<text class="title" x="{MARGIN}" y="20">{escape(picture.title)}</text>',
           f'<text class="subtitle" x="{MARGIN}" y="36">{escape(picture.subtitle)}</text>']
    out.append('<g class="columns">')
    for c in picture.columns:
        out.append(f'<g class="column{" unserved" if c.unserved else ""}" data-stage="{c.stage}">'
                   f'<text x="{_f(c.x)}" y="{HEADER_H - 10}">{escape(c.title)}</text>')
        if c.unserved:
            out.append(f'<rect x="{_f(c.x)}" y="{HEADER_H}" width="{NODE_W}" height="{NODE_H}" rx="6" fill="#fef2f2" '
                       f'stroke="#dc2626" stroke-dasharray="4 3"/><text x="{_f(c.x + 8)}" y="{HEADER_H + 23}" '
                       f'fill="#dc2626">no replica</text>')
        out.append("</g>")
    out.append('</g><g class="edges">')
    for e in picture.edges:
        (x1, y1), (cx1, cy1), (cx2, cy2), (x2, y2) = e.points
        dash = ' stroke-dasharray="6 4"' if e.cost_s is None else ""
        out.append(f'<path class="edge" data-from="{e.source}" data-to="{e.target}" data-units="{e.units}" '
                   f'data-cost-s="{"" if e.cost_s is None else f"{e.cost_s:.6g}"}" '
                   f'd="M{_f(x1)},{_f(y1)} C{_f(cx1)},{_f(cy1)} {_f(cx2)},{_f(cy2)} {_f(x2)},{_f(y2)}" '
                   f'stroke="{e.color}" stroke-width="{e.width:.2f}"{dash}><title>{escape(e.tooltip)}</title></path>')
    out.append('</g><g class="nodes">')
    for n in picture.nodes:
        dash = ' stroke-dasharray="5 3"' if n.dashed else ""
        out.append(f'<g class={quoteattr("node " + " ".join(n.classes))} data-peer="{n.peer_id}" '
                   f'data-stage="{n.stage}" transform="translate({_f(n.x)},{_f(n.y)})">'
                   f'<title>{escape(n.tooltip)}</title>'
                   f'<rect width="{NODE_W}" height="{NODE_H}" rx="6" fill="{n.fill}" stroke="{n.stroke}" '
                   f'stroke-width="{n.stroke_w}"{dash}/>'
                   f'<text x="8" y="15">{escape(n.lines[0])}</text>'
                   f'<text class="detail" x="8" y="30">{escape(n.lines[1])}</text></g>')
    out.append("</g>")
    out.extend(_svg_legend(picture))
    out.append("</svg>")
    return "\n".join(out)


def _legend_text(picture: Picture) -> tuple[str, str, str]:
    if picture.cost_range_s is None:
        cost = "edge cost: none measured"
    else:
        low, high = picture.cost_range_s
        cost = f"edge cost {low * 1000:.1f} ms (green) … {high * 1000:.1f} ms (red); grey dashed: unmeasured"
    widths = f"width: flow units (widest {picture.max_units})"
    if picture.dangling_routes:
        widths += f" · {picture.dangling_routes} route(s) to peers not shown"
    marks = ("boxes: green data holder, blue relay, yellow joining, grey leaving, red ✕ crashed; dashed: relayed; "
             "outline red: diverged, amber: lagging")
    return cost, widths, marks


def _svg_legend(picture: Picture) -> list[str]:
    y = picture.height - 68
    cost, widths, marks = _legend_text(picture)
    last = len(COST_STOPS) - 1
    stops = "".join(f'<stop offset="{i / last:.2f}" stop-color="{cost_color(i / last)}"/>' for i in range(last + 1))
    return ['<g class="legend">', f'<defs><linearGradient id="gwtf-cost">{stops}</linearGradient></defs>',
            f'<rect x="{MARGIN}" y="{_f(y)}" width="120" height="10" fill="url(#gwtf-cost)"/>',
            f'<text x="{MARGIN + 130}" y="{_f(y + 9)}">{escape(cost)}</text>',
            f'<text x="{MARGIN}" y="{_f(y + 28)}">{escape(widths)}</text>',
            f'<text x="{MARGIN}" y="{_f(y + 46)}">{escape(marks)}</text>', "</g>"]


def write_svg(summary: dict[str, Any], path: Path, gone: list[dict[str, Any]] = ()) -> None:
    path.write_text(to_svg(layout(summary, gone)), encoding="utf-8")


def write_png(summary: dict[str, Any], path: Path, gone: list[dict[str, Any]] = (), dpi: int = 100) -> None:
    """The same picture through matplotlib (Agg, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import FancyBboxPatch, PathPatch
    from matplotlib.path import Path as MplPath

    picture = layout(summary, gone)
    fig = plt.figure(figsize=(picture.width / dpi, picture.height / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, picture.width)
    ax.set_ylim(picture.height, 0)
    ax.axis("off")
    ax.text(MARGIN, 20, picture.title, fontsize=11, fontweight="bold", va="baseline")
    ax.text(MARGIN, 36, picture.subtitle, fontsize=8, va="baseline", color="#374151")
    for c in picture.columns:
        ax.text(c.x, HEADER_H - 10, c.title, fontsize=9, fontweight="bold",
                color="#dc2626" if c.unserved else "#374151")
        if c.unserved:
            ax.add_patch(FancyBboxPatch((c.x, HEADER_H), NODE_W, NODE_H, "round,pad=0,rounding_size=6",
                                        facecolor="#fef2f2", edgecolor="#dc2626", linestyle="--"))
            ax.text(c.x + 8, HEADER_H + 23, "no replica", fontsize=8, color="#dc2626")
    codes = [MplPath.MOVETO, MplPath.CURVE4, MplPath.CURVE4, MplPath.CURVE4]
    for e in picture.edges:
        ax.add_patch(PathPatch(MplPath(e.points, codes), facecolor="none", edgecolor=e.color, alpha=0.8,
                               linewidth=e.width * 72 / dpi, linestyle="--" if e.cost_s is None else "-"))
    for n in picture.nodes:
        ax.add_patch(FancyBboxPatch((n.x, n.y), NODE_W, NODE_H, "round,pad=0,rounding_size=6", facecolor=n.fill,
                                    edgecolor=n.stroke, linewidth=n.stroke_w * 72 / dpi,
                                    linestyle="--" if n.dashed else "-", alpha=0.55 if "sink" in n.classes else 1.0))
        ax.text(n.x + 8, n.y + 15, n.lines[0], fontsize=8, family="monospace", va="baseline")
        ax.text(n.x + 8, n.y + 30, n.lines[1], fontsize=7, family="monospace", va="baseline", color="#4b5563")
    cost, widths, marks = _legend_text(picture)
    y = picture.height - 68
    for i in range(60):
        ax.add_patch(FancyBboxPatch((MARGIN + 2 * i, y), 2, 10, "square,pad=0", facecolor=cost_color(i / 59),
                                    edgecolor="none"))
    ax.text(MARGIN + 130, y + 9, cost, fontsize=7, va="baseline")
    ax.text(MARGIN, y + 28, widths, fontsize=7, va="baseline")
    ax.text(MARGIN, y + 46, marks, fontsize=7, va="baseline")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
