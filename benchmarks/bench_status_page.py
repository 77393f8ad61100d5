"""How fast the live page (``gwtf status --serve``) renders simulated swarms of growing size, in a real
headless chromium (Debian's /usr/bin/chromium, driven by Playwright).

For each size the server (in this process) serves a cycle of pre-computed reads of a ``SimulatedSwarm``
(so the DHT and the oracle are not what is measured) and the page polls them once a second. Printed
per size: /status.json and /routing.svg sizes, the server's time to lay out and write the SVG, the
browser's time per update (fetching the SVG and updating the DOM, style and layout included: what
``window.gwtf.renders`` records), and the main thread's long tasks (> 50 ms, PerformanceObserver)
while it updates; ratios against the smallest size. Measures, asserts nothing.

    .venv/bin/python benchmarks/bench_status_page.py [--sizes 10 30 100 300] [--updates 12]
        [--plot docs/img/status-render-time.png] [--screenshot-dir docs/img]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gwtf_cli.web import serve_status  # noqa: E402
from gwtf_cli.web.layout import layout  # noqa: E402
from gwtf_cli.web.render import to_svg  # noqa: E402
from gwtf_cli.web.simulated import SimulatedSwarm  # noqa: E402
from tests.integration.test_status_web import browser_page  # noqa: E402

READS_PER_SIZE = 6
LONG_TASKS = """
window.__longTasks = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__longTasks.push(e.duration); })
  .observe({ type: "longtask", buffered: true });
"""


def measure(n_nodes: int, updates: int, screenshot_dir: Path | None) -> dict:
    simulated = SimulatedSwarm(n_nodes, seed=1)
    reads = [simulated.summary() for _ in range(READS_PER_SIZE)]
    started = time.perf_counter()
    svgs = [to_svg(layout(r)) for r in reads]
    svg_ms = (time.perf_counter() - started) * 1000 / len(reads)
    cycle = itertools.cycle(reads)
    handle = serve_status(lambda: next(cycle), 0, interval_s=1.0)
    try:
        with browser_page(Path(tempfile.mkdtemp(prefix="gwtf-bench-chromium-"))) as page:
            page.add_init_script(LONG_TASKS)
            page.goto(handle.url)
            page.wait_for_function(f"window.gwtf.renders.length >= {updates + 1}", timeout=(updates + 30) * 1000)
            renders = page.evaluate("window.gwtf.renders")[1:]  # the first includes the page's own start
            long_tasks = page.evaluate("window.__longTasks")
            if screenshot_dir is not None and n_nodes == 100:
                page.screenshot(path=str(screenshot_dir / "status-simulated-100.png"), full_page=False)
    finally:
        handle.close()
    totals = sorted(r["total_ms"] for r in renders)
    return {"nodes": n_nodes, "json_kb": len(json.dumps(reads[-1])) / 1024,
            "svg_kb": statistics.mean(len(s) for s in svgs) / 1024, "svg_build_ms": svg_ms,
            "render_median_ms": statistics.median(totals),
            "render_p95_ms": totals[max(0, round(0.95 * len(totals)) - 1)],
            "dom_median_ms": statistics.median(r["dom_ms"] for r in renders),
            "long_tasks": len(long_tasks), "longest_task_ms": max(long_tasks, default=0.0), "updates": len(renders)}


def plot(results: list[dict], path: Path) -> None:
    from matplotlib import pyplot as plt

    nodes = [r["nodes"] for r in results]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot(nodes, [r["render_median_ms"] for r in results], "o-", label="page update, median (browser)")
    ax.plot(nodes, [r["render_p95_ms"] for r in results], "o--", label="page update, p95 (browser)")
    ax.plot(nodes, [r["svg_build_ms"] for r in results], "s-", label="SVG layout + write (server)")
    ax.axhline(100, color="grey", linewidth=0.8, linestyle=":")
    ax.text(nodes[0], 104, "100 ms", color="grey", fontsize=8)
    ax.set_xscale("log")
    ax.set_xticks(nodes, [str(n) for n in nodes])
    ax.set_xlabel("simulated nodes")
    ax.set_ylabel("ms")
    ax.set_title("gwtf status --serve: time per update")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 100, 300])
    parser.add_argument("--updates", type=int, default=12, help="page updates measured per size")
    parser.add_argument("--plot", type=Path, help="write the figure here (PNG)")
    parser.add_argument("--screenshot-dir", type=Path, help="save a screenshot of the 100-node page here")
    args = parser.parse_args()
    results = []
    print(f"{'nodes':>6} {'json KB':>8} {'svg KB':>7} {'svg ms':>7} {'update ms':>10} {'p95 ms':>7} {'dom ms':>7} "
          f"{'long tasks':>10} {'longest':>8} {'x update':>9}")
    for n in args.sizes:
        r = measure(n, args.updates, args.screenshot_dir)
        results.append(r)
        ratio = r["render_median_ms"] / results[0]["render_median_ms"]
        print(f"{n:>6} {r['json_kb']:>8.0f} {r['svg_kb']:>7.0f} {r['svg_build_ms']:>7.1f} "
              f"{r['render_median_ms']:>10.1f} {r['render_p95_ms']:>7.1f} {r['dom_median_ms']:>7.1f} "
              f"{r['long_tasks']:>10} {r['longest_task_ms']:>8.0f} {ratio:>8.1f}x", flush=True)
    print(json.dumps(results))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
