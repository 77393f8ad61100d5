"""Benchmark: what the Prometheus metrics cost a node, and the sample Grafana dashboard against a real Prometheus.

It prints the CPU time one scrape costs a node (all its collectors, ``generate_latest``, in this
process: a relay with 16 flow neighbours and 64 measured links, 200 scrapes). Then local swarms of real
daemons (a data holder and one relay per stage; gpt2-tiny, 2 stages, 4 microbatches of 2 x 16 tokens;
``gwtf join`` processes on 127.0.0.1) train ``--iterations`` each, and it prints side by side:

* the cost: the same swarm without and with ``--metrics-port`` on every node, in pairs whose order
  alternates (off-on, on-off, ...: a drift of the machine's load cancels), scraped once a second while it
  trains when on: the median seconds per iteration (the data holder's, iterations after the first two)
  of each run, each pair's ratio on / off, and the median of those ratios;
* a scrape: in each run with metrics, ``GET /metrics`` of every node 20 times while it trains: latency
  (median, p95), body size and number of samples;
* with ``--prometheus BIN`` (Debian's ``prometheus`` package): Prometheus scraping every node each second
  during the last run with metrics; then every query of ``docs/grafana-dashboard.json`` (Grafana's
  variables set to "All", ``$__rate_interval`` to 15 s) evaluated through Prometheus's HTTP API at the
  time of the run's last iteration: how many series each returns, or its error.

    python benchmarks/bench_metrics.py --pairs 4 --prometheus /usr/bin/prometheus
    python benchmarks/bench_metrics.py --pairs 0     # the scrape's CPU time only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager, suppress
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.config import RunSpec
from gwtfp2p.localswarm.processes import FAST, Swarm

ROOT = Path(__file__).resolve().parents[1]
SPEC = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=11, lr=3e-3, microbatch_size=2,
               seq_len=16, microbatches_per_dh=4)
SCRAPES = 20


def spec_file(directory: Path) -> str:
    path = directory / "spec.json"
    path.write_text(json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in vars(SPEC).items()}))
    return str(path)


def get(url: str, timeout_s: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read()


def scrape_figures(ports: list[int]) -> dict:
    """``SCRAPES`` scrapes of every node: latency (ms), body size, samples."""
    latencies, sizes, samples = [], [], []
    for _ in range(SCRAPES):
        for port in ports:
            began = time.perf_counter()
            body = get(f"http://127.0.0.1:{port}/metrics")
            latencies.append((time.perf_counter() - began) * 1000)
            sizes.append(len(body))
            samples.append(sum(1 for line in body.splitlines() if line and not line.startswith(b"#")))
    latencies.sort()
    return {"median_ms": statistics.median(latencies), "p95_ms": latencies[int(0.95 * (len(latencies) - 1))],
            "bytes": statistics.median(sizes), "samples": statistics.median(samples)}


class Poller(threading.Thread):
    """Scrapes every node once a second (as Prometheus would) until stopped."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__(daemon=True)
        self.ports, self.stop = ports, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for port in self.ports:
                with suppress(OSError):
                    get(f"http://127.0.0.1:{port}/metrics")


def run_swarm(metrics: bool, iterations: int, prometheus: str | None) -> dict:
    """One swarm; per-iteration seconds (and with metrics, scrape figures, dashboard query results)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        swarm = Swarm(directory, FAST)
        extra = ("--metrics-port", "0") if metrics else ()
        try:
            dh = swarm.start("dh0", "--role", "data", "--run-spec", spec_file(directory), "--min-nodes", "3",
                             "--max-iterations", str(iterations), *extra)
            relays = [swarm.spawn_relay(f"r{s}", str(s), *extra) for s in (1, 2)]
            for relay in relays:
                relay.wait_ready()
            ports = [d.ready["metrics_port"] for d in (dh, *relays)] if metrics else []
            result: dict = {"metrics": metrics}
            with prometheus_server(prometheus, ports, directory) as prom:
                poller = Poller(ports if metrics and prom is None else [])
                poller.start()
                dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= 2, 300, "iteration 2")
                if metrics:
                    result["scrape"] = scrape_figures(ports)
                dh.wait_event("training_done", 600)
                poller.stop.set()
                if prom is not None:
                    last = max(e["time"] for e in dh.of("iteration"))
                    result["queries"] = dashboard_queries(prom, last)
            seconds = [e["seconds"] for e in dh.of("iteration") if e["iteration"] >= 2]
            result["iteration_s"] = statistics.median(seconds)
            return result
        finally:
            swarm.close()


@contextmanager
def prometheus_server(binary: str | None, ports: list[int], directory: Path):
    """Prometheus scraping ``ports`` each second (None without ``binary`` or ports); its base URL."""
    if binary is None or not ports:
        yield None
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
    config = directory / "prometheus.yml"
    config.write_text(f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n"
                      f"scrape_configs: [{{job_name: gwtf, static_configs: [{{targets: [{targets}]}}]}}]\n")
    popen = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={directory / 'tsdb'}",
                              f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get(url + "/-/ready", 2)
                break
            except OSError:
                if time.monotonic() > deadline or popen.poll() is not None:
                    raise RuntimeError("prometheus did not start") from None
                time.sleep(0.5)
        yield url
    finally:
        popen.terminate()
        popen.wait(timeout=30)


def dashboard_queries(prom: str, at: float) -> list[dict]:
    """Every target of the dashboard, evaluated at ``at`` (Grafana's variables: all values)."""
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    results = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$__rate_interval", "15s")
                    .replace("$run_id", ".*").replace("$role", ".*").replace("$stage", ".*"))
            query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
            row = {"panel": panel["title"], "ref": target["refId"]}
            try:
                row["series"] = len(json.loads(get(f"{prom}/api/v1/query?{query}"))["data"]["result"])
            except (OSError, ValueError, KeyError) as e:
                row["error"] = str(e)
            results.append(row)
    return results


def collect_cost(scrapes: int = 200) -> dict:
    """CPU seconds of one scrape of a relay with 16 flow neighbours and 64 measured links (in this process)."""
    from types import SimpleNamespace

    from prometheus_client import ProcessCollector
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from gwtfp2p.daemon.lifecycle.metrics import NodeMetrics, StartupMetrics
    from gwtfp2p.daemon.lifecycle.self_report import Identity
    from gwtfp2p.daemon.lifecycle.traffic import CountedHandlers
    from gwtfp2p.daemon.progress import NodeProgress
    from gwtfp2p.daemon.swarm.links import LinkTable
    from gwtfp2p.daemon.swarm.sending import Traffic
    from gwtfp2p.flow.node import Route

    peers = [f"12D3KooW{i:044d}" for i in range(64)]
    links = LinkTable(1e9)
    for i, peer in enumerate(peers):
        links.observe_rtt(peer, 0.001 * (i + 1))
        links.observe_transfer(peer, 1 << 20, 0.01 + 0.001 * (i + 1))
    stages = {peer: (0 if i < 8 else 2) for i, peer in enumerate(peers[:16])}
    routes = [Route(peers[i % 8], f"e{i}", peers[i % 8], f"o{i}", peers[8 + i % 8], True, 0.1) for i in range(16)]
    routing = SimpleNamespace(routes=lambda: routes, messages_in=1000, cost=lambda p: 0.02,
                              neighbours=lambda stage=None: sorted(p for p, s in stages.items() if s == stage),
                              summary=lambda: [(r.next, r.sink, 1) for r in routes])
    progress = NodeProgress(state="online", loss=3.0, tokens_per_s=1e4, started_at=1.0, ready_at=2.0)
    metrics = NodeMetrics(Identity("run", peers[20], "relay", 1, 16, (), "Tokyo"), progress,
                          gate=SimpleNamespace(iteration=100), work=SimpleNamespace(forwards=1, backwards=1,
                          in_flight=0), routing=routing, links=links, neighbour_stages=(0, 1, 2),
                          sent=SimpleNamespace(traffic=Traffic()), received=CountedHandlers(None),
                          compute=SimpleNamespace(busy_s=1.0), clock=time.monotonic,
                          joined=SimpleNamespace(source="replica", state_bytes=1, download_s=1.0, replayed_steps=0))
    for i in range(100):
        metrics.aggregation.observe("gather" if i % 2 else "step", 0.01 * i)
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    registry.register(StartupMetrics(progress))
    registry.register(metrics)
    body = generate_latest(registry)
    began = time.process_time()
    for _ in range(scrapes):
        generate_latest(registry)
    cpu_ms = (time.process_time() - began) / scrapes * 1000
    return {"cpu_ms": cpu_ms, "bytes": len(body),
            "samples": sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="(off, on) pairs of swarms")
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--prometheus", default=None, help="the prometheus binary: check the dashboard's queries")
    args = parser.parse_args()
    cost = collect_cost()
    print(f"one scrape of a relay with 16 flow neighbours and 64 links: {cost['cpu_ms']:.2f} ms of CPU, "
          f"{cost['bytes'] / 1024:.1f} KiB, {cost['samples']} samples", flush=True)
    if args.pairs == 0:
        return
    runs, ratios = [], []
    for pair in range(args.pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        for metrics in order:
            last = pair == args.pairs - 1 and metrics
            runs.append(run_swarm(metrics, args.iterations, args.prometheus if last else None))
            r = runs[-1]
            print(f"run {len(runs)}: metrics {'on ' if metrics else 'off'}  {r['iteration_s'] * 1000:7.1f} ms per "
                  f"iteration (median)" + (f"  scrape {r['scrape']}" if metrics else ""), flush=True)
        off, on = sorted(runs[-2:], key=lambda r: r["metrics"])
        ratios.append(on["iteration_s"] / off["iteration_s"])
    print(f"\nseconds per iteration on / off, by pair: {', '.join(f'{x:.3f}' for x in ratios)}; median "
          f"{statistics.median(ratios):.3f}")
    for r in runs:
        if r["metrics"]:
            s = r["scrape"]
            print(f"scrape: median {s['median_ms']:.1f} ms, p95 {s['p95_ms']:.1f} ms, {s['bytes'] / 1024:.1f} KiB, "
                  f"{s['samples']:.0f} samples")
    queries = next((r["queries"] for r in runs if "queries" in r), None)
    if queries is not None:
        empty = [q for q in queries if q.get("series", 0) == 0]
        print(f"\ndashboard: {len(queries)} queries, {len(queries) - len(empty)} returned series")
        for q in queries:
            print(f"  {q['panel'][:60]:60s} {q['ref']}: {q.get('series', q.get('error'))}")


if __name__ == "__main__":
    main()
