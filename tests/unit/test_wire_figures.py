"""A local swarm's figures read from its daemons' progress reports (``localswarm/wire_figures.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gwtfp2p.localswarm.wire_figures import bytes_per_microbatch_hop, compute_ms


@dataclass
class FakeDaemon:
    name: str
    events: list[dict] = field(default_factory=list)

    def of(self, name: str) -> list[dict]:
        return [e for e in self.events if e["event"] == name]


def progress(time_s: float, **fields) -> dict:
    return {"event": "progress", "time": time_s, **fields}


def test_compute_ms_is_each_daemons_median_report_since_the_given_time():
    relay = FakeDaemon("r1a", [progress(1.0, compute_ms=900.0), progress(3.0, compute_ms=300.0),
                               progress(5.0, compute_ms=320.0), progress(7.0, compute_ms=340.0),
                               {"event": "iteration", "time": 6.0, "compute_ms": 1.0}])
    holder = FakeDaemon("dh", [progress(4.0, compute_ms=20.0), progress(6.0, compute_ms=30.0)])
    assert compute_ms([relay, holder], since=2.0) == {"r1a": 320.0, "dh": 25.0}


def test_daemons_without_a_measured_compute_are_left_out():
    unmeasured = FakeDaemon("r2a", [progress(3.0, compute_ms=0.0), progress(4.0)])
    early = FakeDaemon("r2b", [progress(1.0, compute_ms=250.0)])
    hostile = FakeDaemon("r1b", [progress(3.0, compute_ms="fast"), progress(4.0, compute_ms=None)])
    assert compute_ms([unmeasured, early, hostile], since=2.0) == {}


def test_bytes_per_microbatch_hop_is_forward_plus_backward_per_transfer():
    totals = {"forwards": 12, "forward_bytes": 12 * 1000, "backwards": 12, "backward_bytes": 12 * 800}
    assert bytes_per_microbatch_hop(totals) == 1800.0
    assert bytes_per_microbatch_hop({"forwards": 0, "backwards": 3}) is None
