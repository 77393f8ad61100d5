"""A local swarm's kept logs carry each daemon's events (``Swarm.save_events``): what it reported beside what
it logged, one JSON object per line, appended (a name reused by a replacement keeps both runs' events)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from gwtfp2p.localswarm.processes import Swarm


def fake_daemon(name: str, events: list[dict]) -> SimpleNamespace:
    return SimpleNamespace(name=name, of_all=lambda: list(events))


def test_every_daemons_events_are_written_beside_its_log(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)
    placed = {"event": "placed", "peer_id": "QmRelay", "stage": 1, "reason": "--stage"}
    swarm.daemons += [fake_daemon("relay0", [placed, {"event": "step", "iteration": 0}]),
                      fake_daemon("dh0", []), fake_daemon("relay0", [{"event": "ready"}])]
    swarm.save_events()
    lines = (tmp_path / "relay0.events.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [placed, {"event": "step", "iteration": 0}, {"event": "ready"}]
    assert (tmp_path / "dh0.events.jsonl").read_text(encoding="utf-8") == ""
