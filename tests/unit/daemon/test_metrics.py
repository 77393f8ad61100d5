"""The node's Prometheus metrics over fake components: every figure read from its source at scrape time,
the event-fed counters, the aggregation timing, the byte counts at the inbox, the endpoint's answers, and
the sample Grafana dashboard (it asks only for metrics a node exports)."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from gwtfp2p.config import ConfigError
from gwtfp2p.daemon.config import NetworkConfig
from gwtfp2p.daemon.lifecycle.metrics import NodeMetrics, StartupMetrics, Timings
from gwtfp2p.daemon.lifecycle.metrics_http import MetricsEndpoint
from gwtfp2p.daemon.lifecycle.self_report import Identity
from gwtfp2p.daemon.lifecycle.traffic import CountedHandlers
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.sending import Traffic
from gwtfp2p.daemon.wire import GRAD_KIND
from gwtfp2p.flow.node import Route
from gwtfp2p.transport import Ack, StateBlob, TransferMeta
from tests.unit.daemon.fakes import DH, PA, PB, FakeClock, mb, pid

ROOT = Path(__file__).resolve().parents[3]
ME, NEXT = pid("Me"), pid("Next")
DEFAULT_BW = 1e9


@dataclass
class FakeRouting:
    """Routes, flow neighbours by stage and their costs, as ``FlowDriver`` has them."""

    routes_: list[Route] = field(default_factory=list)
    stages: dict[str, int] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)
    messages_in: int = 0

    def routes(self) -> list[Route]:
        return self.routes_

    def neighbours(self, stage: int | None = None) -> list[str]:
        return sorted(p for p, s in self.stages.items() if stage is None or s == stage)

    def cost(self, peer: str) -> float | None:
        return self.costs.get(peer)

    def summary(self) -> list[tuple[str, str, int]]:
        return [(r.next, r.sink, 1) for r in self.routes_ if r.next and r.out_edge and r.complete]


class FakeInbox:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        self.calls.append("forward")
        return Ack()

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        self.calls.append("backward")
        return Ack(duplicate=True)

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        self.calls.append("flow")

    async def get_state(self, stage: int) -> StateBlob | None:
        return StateBlob(stage=stage, iteration=7, data=b"s" * 1000)

    async def get_steps(self, stage: int, since_iteration: int) -> StateBlob | None:
        return None  # nothing kept: nothing served


def relay_metrics(work: Any = None, joined: Any = None, holder: bool = False) -> tuple[NodeMetrics, dict[str, Any]]:
    """A relay's metrics over fakes (``holder``: a data holder's, without the relay's work counters)."""
    identity = Identity("run1", ME, "relay", 1, 4, (), "Tokyo")
    progress = NodeProgress(state="online", loss=3.25, tokens_per_s=1234.5)
    routing = FakeRouting(
        routes_=[Route(DH, "e1", DH, "o1", NEXT, True, 0.1), Route(DH, "e2", DH, "o2", NEXT, True, 0.1),
                 Route(DH, "e3", PA, None, None, False, 0.2)],
        stages={DH: 0, PA: 0, NEXT: 2}, costs={DH: 0.012, NEXT: 0.034}, messages_in=17)
    links = LinkTable(DEFAULT_BW)
    links.observe_rtt(NEXT, 0.004)
    links.observe_rtt(DH, 0.002)
    links.observe_transfer(NEXT, 1 << 20, 0.004 + 0.01)
    sent = SimpleNamespace(traffic=Traffic(forwards=3, forward_bytes=3000, backwards=2, backward_bytes=2000))
    parts = dict(gate=SimpleNamespace(iteration=9), routing=routing, links=links, sent=sent,
                 received=CountedHandlers(FakeInbox()),
                 compute=SimpleNamespace(busy_s=1.5), clock=FakeClock(),
                 joined=joined or SimpleNamespace(source="replica", state_bytes=4096, download_s=0.25,
                                                  replayed_steps=2))
    work = None if holder else SimpleNamespace(forwards=11, backwards=10, in_flight=1) if work is None else work
    metrics = NodeMetrics(identity, progress, work=work, neighbour_stages={0, 1, 2}, **parts)
    return metrics, parts


def scrape(*collectors: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``generate_latest`` parsed back: (sample name, sorted labels) -> value."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_scrape_reads_each_figure_from_its_component() -> None:
    metrics, _ = relay_metrics()
    got = scrape(metrics)
    assert got[("gwtf_node_info", (("location", "Tokyo"), ("peer_id", ME), ("role", "relay"), ("run_id", "run1"),
                                   ("stage", "1")))] == 1
    assert got[("gwtf_iteration", ())] == 9
    assert got[("gwtf_loss", ())] == 3.25 and got[("gwtf_tokens_per_second", ())] == 1234.5
    assert got[("gwtf_microbatches_forwarded_total", ())] == 11
    assert got[("gwtf_microbatches_backwarded_total", ())] == 10
    assert got[("gwtf_microbatches_in_flight", ())] == 1
    assert got[("gwtf_flow_units", ())] == 2
    assert got[("gwtf_flow_units_in", (("peer", DH),))] == 2 and got[("gwtf_flow_units_in", (("peer", PA),))] == 1
    assert got[("gwtf_flow_units_out", (("peer", NEXT),))] == 2
    assert ("gwtf_flow_units_out", (("peer", DH),)) not in got
    assert got[("gwtf_edge_cost_seconds", (("peer", NEXT), ("peer_stage", "2")))] == 0.034
    assert ("gwtf_edge_cost_seconds", (("peer", PA), ("peer_stage", "0"))) not in got  # no cost known yet
    assert got[("gwtf_flow_messages_received_total", ())] == 17
    assert got[("gwtf_link_rtt_seconds", (("peer", NEXT),))] == pytest.approx(0.004)
    assert got[("gwtf_link_bandwidth_bytes_per_second", (("peer", NEXT),))] == pytest.approx((1 << 20) / 0.01)
    assert ("gwtf_link_bandwidth_bytes_per_second", (("peer", DH),)) not in got  # not measured: no default shown
    assert got[("gwtf_sent_bytes_total", (("kind", "forward"),))] == 3000
    assert got[("gwtf_sent_bytes_total", (("kind", "aggregation"),))] == 0
    assert got[("gwtf_sent_messages_total", (("kind", "backward"),))] == 2
    assert got[("gwtf_compute_busy_seconds_total", ())] == 1.5
    assert got[("gwtf_state_downloads_total", ())] == 1 and got[("gwtf_state_download_bytes", ())] == 4096
    assert got[("gwtf_state_download_seconds", ())] == 0.25 and got[("gwtf_replayed_steps_total", ())] == 2


def test_figures_move_with_their_sources() -> None:
    work = SimpleNamespace(forwards=1, backwards=0, in_flight=1)
    metrics, parts = relay_metrics(work=work)
    before = scrape(metrics)
    work.forwards, work.backwards, parts["gate"].iteration = 5, 4, 10
    parts["sent"].traffic.add("backward", 100)
    metrics.progress.loss = None  # not known (e.g. before the first closed iteration): no sample
    after = scrape(metrics)
    assert after[("gwtf_microbatches_forwarded_total", ())] - before[("gwtf_microbatches_forwarded_total", ())] == 4
    assert after[("gwtf_iteration", ())] == 10 and ("gwtf_loss", ()) not in after
    sent = ("gwtf_sent_bytes_total", (("kind", "backward"),))
    assert after[sent] == before[sent] + 100


def test_no_state_download_when_the_state_came_otherwise() -> None:
    joined = SimpleNamespace(source="checkpoint", state_bytes=4096, download_s=0.0, replayed_steps=0)
    got = scrape(relay_metrics(joined=joined)[0])
    assert got[("gwtf_state_downloads_total", ())] == 0 and got[("gwtf_state_download_bytes", ())] == 0


def test_events_count_recoveries_hops_and_steps() -> None:
    metrics, _ = relay_metrics()
    for kind, hops in (("resend", 1), ("resend", 2), ("repoint", 0), ("gradient_resend", 0)):
        metrics.observe({"event": "recovery", "kind": kind, "recomputed_hops": hops})
    metrics.observe({"event": "recovery", "kind": "resend", "recomputed_hops": "junk"})  # never raises
    metrics.observe({"event": "step", "iteration": 3})
    metrics.observe({"event": "progress"})
    got = scrape(metrics)
    assert got[("gwtf_recoveries_total", (("kind", "resend"),))] == 3
    assert got[("gwtf_recoveries_total", (("kind", "repoint"),))] == 1
    assert got[("gwtf_recomputed_hops_total", ())] == 3
    assert got[("gwtf_steps_total", ())] == 1


def test_a_data_holder_counts_its_microbatches_from_its_iterations() -> None:
    metrics, _ = relay_metrics(holder=True)
    metrics.observe({"event": "iteration", "iteration": 0, "microbatches": 4, "lost_microbatches": 0})
    metrics.observe({"event": "iteration", "iteration": 1, "microbatches": 3, "lost_microbatches": 1})
    got = scrape(metrics)
    assert got[("gwtf_microbatches_forwarded_total", ())] == 8
    assert got[("gwtf_microbatches_backwarded_total", ())] == 7
    assert got[("gwtf_steps_total", ())] == 2 and ("gwtf_microbatches_in_flight", ()) not in got


class SlowSteps:
    """gather/step taking ``gather_s``/``step_s`` of the fake clock; ``fail`` makes gather raise."""

    def __init__(self, clock: FakeClock, gather_s: float, step_s: float, fail: bool = False) -> None:
        self.clock, self.gather_s, self.step_s, self.fail = clock, gather_s, step_s, fail

    async def gather(self, iteration: int, tags: dict | None = None) -> Any:
        self.clock.advance(self.gather_s)
        if self.fail:
            raise asyncio.CancelledError
        return iteration

    async def step(self, gathered: Any, total_sq_norm: float | None) -> Any:
        self.clock.advance(self.step_s)
        return gathered


def test_aggregation_is_timed_gather_and_step_apart() -> None:
    metrics, parts = relay_metrics()
    clock = parts["clock"]

    async def run(steps: SlowSteps) -> None:
        timed = metrics.timed(steps)
        await timed.step(await timed.gather(1), None)

    asyncio.run(run(SlowSteps(clock, 0.3, 0.02)))
    asyncio.run(run(SlowSteps(clock, 7.0, 0.04)))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run(SlowSteps(clock, 99.0, 0.0, fail=True)))  # not timed
    got = scrape(metrics)
    gather = (("phase", "gather"),)
    assert got[("gwtf_aggregation_seconds_count", gather)] == 2
    assert got[("gwtf_aggregation_seconds_sum", gather)] == pytest.approx(7.3)
    assert got[("gwtf_aggregation_seconds_bucket", (("le", "0.5"), ("phase", "gather")))] == 1
    assert got[("gwtf_aggregation_seconds_bucket", (("le", "10.0"), ("phase", "gather")))] == 2
    assert got[("gwtf_aggregation_seconds_bucket", (("le", "0.025"), ("phase", "step")))] == 1
    assert got[("gwtf_aggregation_seconds_bucket", (("le", "+Inf"), ("phase", "step")))] == 2


def test_timings_buckets_are_cumulative_and_inclusive() -> None:
    timings = Timings((1.0, 2.0))
    for seconds in (0.5, 1.0, 1.5, 3.0):
        timings.observe("x", seconds)
    family = timings.family("t_seconds", "t", "phase")
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name == "t_seconds_bucket"}
    assert buckets == {"1.0": 2, "2.0": 3, "+Inf": 4}


def test_inbox_traffic_is_counted_and_passed_on() -> None:
    inbox = FakeInbox()
    counted = CountedHandlers(inbox)
    meta = TransferMeta(microbatch=mb(0), stage=1)
    grad = TransferMeta(microbatch=mb(0), stage=1, tags={"kind": GRAD_KIND})
    half = TransferMeta(microbatch=mb(0), stage=1, codec="float16")  # decoded by the transport: 5 floats

    async def scenario() -> list[Any]:
        return [await counted.on_forward(PA, meta, torch.zeros(10)),
                await counted.on_forward(PB, grad, torch.zeros(3, dtype=torch.float64)),
                await counted.on_backward(PA, half, torch.zeros(5)),
                await counted.on_flow_message(PA, b"F" + b"x" * 9),
                await counted.get_state(1), await counted.get_steps(1, 0)]

    answers = asyncio.run(scenario())
    assert inbox.calls == ["forward", "forward", "backward", "flow"]
    assert answers[2] == Ack(duplicate=True) and answers[4].iteration == 7 and answers[5] is None
    # wire bytes, as the sender counts them: 5 float16 values and their scale
    assert dict(counted.received_bytes) == {"forward": 40, "aggregation": 24, "backward": 14, "message": 10}
    assert dict(counted.received) == {"forward": 1, "aggregation": 1, "backward": 1, "message": 1}
    assert dict(counted.served) == {"state": 1} and dict(counted.served_bytes) == {"state": 1000}


def test_startup_metrics_follow_the_state_and_the_phases() -> None:
    progress = NodeProgress(started_at=1000.0)
    startup = StartupMetrics(progress)
    startup.observe({"event": "startup", "phase": "dht", "seconds": 1.5})
    startup.observe({"event": "downloading", "source": PA})
    got = scrape(startup)
    assert got[("gwtf_node_state", (("state", "joining"),))] == 1
    assert got[("gwtf_node_state", (("state", "online"),))] == 0
    assert got[("gwtf_startup_phase_seconds", (("phase", "dht"),))] == 1.5
    assert got[("gwtf_state_download_attempts_total", ())] == 1 and ("gwtf_ready_time_seconds", ()) not in got
    progress.state, progress.ready_at = "online", 1010.0
    got = scrape(startup)
    assert got[("gwtf_node_state", (("state", "online"),))] == 1 and got[("gwtf_ready_time_seconds", ())] == 1010


def test_endpoint_answers_metrics_only_to_get_on_its_path() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StartupMetrics(NodeProgress()))
    endpoint = MetricsEndpoint(registry, request_timeout_s=1.0)
    status, content_type, body = endpoint.answer("GET", "/metrics?x=1", "")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4") and b"gwtf_node_state" in body
    status, content_type, body = endpoint.answer("GET", "/metrics", "application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    assert endpoint.answer("POST", "/metrics", "")[0] == 405
    assert endpoint.answer("GET", "/", "")[0] == 404


def exported_names() -> set[str]:
    """Every metric name a data holder's and a relay's collectors export (counters with ``_total``)."""
    relay, _ = relay_metrics()
    holder, _ = relay_metrics(holder=True)
    relay.aggregation.observe("gather", 0.1)  # labelled series exist once they have a sample
    relay.observe({"event": "recovery", "kind": "resend", "recomputed_hops": 1})
    startup = StartupMetrics(NodeProgress(ready_at=1.0))
    startup.observe({"event": "startup", "phase": "dht", "seconds": 1.0})
    names = {re.sub(r"_(bucket|count|sum)$", "", name) for name, _ in scrape(relay)}
    return names | {name for name, _ in scrape(holder)} | {name for name, _ in scrape(startup)}


def test_the_grafana_dashboard_asks_only_for_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"\bgwtf_[a-z_]+", expr)}
    used = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
    assert len(exprs) >= 12 and used
    assert used <= exported_names(), used - exported_names()
    required = {"gwtf_iteration", "gwtf_loss", "gwtf_tokens_per_second", "gwtf_microbatches_forwarded_total",
                "gwtf_microbatches_backwarded_total", "gwtf_recoveries_total", "gwtf_recomputed_hops_total",
                "gwtf_flow_units_in", "gwtf_flow_units_out", "gwtf_edge_cost_seconds", "gwtf_link_rtt_seconds",
                "gwtf_link_bandwidth_bytes_per_second", "gwtf_sent_bytes_total", "gwtf_received_bytes_total",
                "gwtf_aggregation_seconds", "gwtf_state_downloads_total"}
    assert required <= used, required - used


@pytest.mark.parametrize("port", [-1, 65536, "9400"])
def test_a_bad_metrics_port_names_the_flag(port: Any) -> None:
    with pytest.raises(ConfigError, match="--metrics-port"):
        NetworkConfig(metrics_port=port)


def test_join_passes_the_metrics_port_only_when_given() -> None:
    from gwtf_cli.join_cmd import build_config

    flags = dict(role="data", stage=None, initial_peers=[], host=None, port=None, announce=[], device=None,
                 capacity=None, identity=None, run_spec=None, location=None, link_scale=None, tick_s=None,
                 heartbeat_s=None, shard=None, max_iterations=None, min_nodes=None, torch_threads=None, grace_s=None,
                 bandwidth=None, startup_timeout_s=None, checkpoint_dir=None, checkpoint_every=None,
                 replay_steps=None)
    assert build_config(**flags).network.metrics_port is None  # off by default
    assert build_config(**flags, metrics_port=0).network.metrics_port == 0
