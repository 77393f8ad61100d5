"""The heartbeat file of ``gwtf join --heartbeat-file`` (cli/heartbeat.py) and its health check."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtf_cli.heartbeat import HeartbeatSink, check, main, read_heartbeat, with_heartbeat
from gwtfp2p.config import ConfigError

READY = {"event": "ready", "peer_id": "12D3KooWPeer", "role": "relay", "stage": 1, "run_id": "abc",
         "maddrs": ["/ip4/127.0.0.1/tcp/31337/p2p/12D3KooWPeer"], "iteration": 0}


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, clock: Clock | None = None) -> tuple[HeartbeatSink, list[dict], Path]:
    seen: list[dict] = []
    path = tmp_path / "hb" / "heartbeat.json"
    return HeartbeatSink(seen.append, path, clock=clock or Clock()), seen, path


def test_nothing_is_written_before_ready_and_every_event_is_forwarded(tmp_path):
    sink, seen, path = make(tmp_path)
    sink({"event": "placed", "stage": 1})
    assert not path.exists()
    sink(READY)
    sink({"event": "progress", "iteration": 3})
    assert [e["event"] for e in seen] == ["placed", "ready", "progress"]
    record = read_heartbeat(path)
    assert record["event"] == "ready" and record["peer_id"] == "12D3KooWPeer"
    assert record["maddrs"] == READY["maddrs"] and record["time"] == 1000.0


def test_at_most_one_write_per_second_except_ready_leaving_stopped(tmp_path):
    clock = Clock()
    sink, _, path = make(tmp_path, clock)
    sink(READY)
    clock.now += 0.4
    sink({"event": "progress", "iteration": 1})
    assert read_heartbeat(path)["event"] == "ready"  # too soon after the last write
    clock.now += 0.6
    sink({"event": "iteration", "iteration": 2})
    assert read_heartbeat(path)["iteration"] == 2 and read_heartbeat(path)["time"] == 1001.0
    clock.now += 0.1
    sink({"event": "leaving", "iteration": 2})
    clock.now += 0.1
    sink({"event": "stopped", "iteration": 2})
    assert read_heartbeat(path)["event"] == "stopped" and read_heartbeat(path)["time"] == pytest.approx(1001.2)


def test_a_file_left_by_an_earlier_run_is_removed_at_start(tmp_path):
    path = tmp_path / "heartbeat.json"
    path.write_text(json.dumps({"time": 999.0, "event": "progress", "peer_id": "old"}))
    HeartbeatSink(lambda _e: None, path, clock=Clock())
    assert not path.exists()


def test_writes_are_atomic_replacements_that_leave_no_temporary_file(tmp_path):
    clock = Clock()
    sink, _, path = make(tmp_path, clock)
    sink(READY)
    for i in range(5):
        clock.now += 1.0
        sink({"event": "progress", "iteration": i})
    assert sorted(p.name for p in path.parent.iterdir()) == ["heartbeat.json"]
    assert read_heartbeat(path)["iteration"] == 4


def test_a_failed_write_is_logged_and_the_node_goes_on(tmp_path, caplog):
    sink, seen, path = make(tmp_path)
    path.parent.rmdir()  # the folder vanished (a volume unmounted)
    with caplog.at_level(logging.WARNING, logger="gwtf_cli.heartbeat"):
        sink(READY)
        sink({"event": "stopped", "iteration": 0})
    assert len(seen) == 2 and not path.exists()
    assert len([r for r in caplog.records if "heartbeat" in r.getMessage()]) == 1  # once, not per event


def test_an_unwritable_path_is_a_config_error_naming_the_flag(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="--heartbeat-file"):
        HeartbeatSink(lambda _e: None, blocker / "heartbeat.json")


def test_without_a_path_the_sink_is_unchanged(tmp_path):
    def sink(_event: dict) -> None:
        return None

    assert with_heartbeat(sink, None) is sink and with_heartbeat(sink, "") is sink
    assert isinstance(with_heartbeat(sink, str(tmp_path / "hb.json")), HeartbeatSink)


def test_check_tells_fresh_stale_missing_malformed_and_future_apart(tmp_path):
    path = tmp_path / "hb.json"
    assert check(path, 60, 1000.0) == (False, f"no heartbeat file {str(path)!r} (the node is not ready yet, "
                                               "or not running)")
    path.write_text("{not json")
    assert not check(path, 60, 1000.0)[0]
    path.write_text(json.dumps({"event": "progress"}))
    assert "no time stamp" in check(path, 60, 1000.0)[1]
    path.write_text(json.dumps({"time": 950.0, "event": "progress", "iteration": 7}))
    fresh, reason = check(path, 60, 1000.0)
    assert fresh and "progress at iteration 7, 50.0 s ago" in reason
    fresh, reason = check(path, 30, 1000.0)
    assert not fresh and reason.startswith("stale")
    assert not check(path, 60, 900.0)[0]  # stamped 50 s in the future


def test_main_exit_codes_and_peer_id(tmp_path, capsys):
    path = tmp_path / "hb.json"
    assert main([str(path)]) == 1
    assert "unhealthy" in capsys.readouterr().err
    sink = HeartbeatSink(lambda _e: None, path)  # wall clock, as in gwtf join
    sink(READY)
    assert main([str(path)]) == 0
    assert main([str(path), "--print-peer-id"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "12D3KooWPeer"
    assert main([str(path), "--max-age-s", "-1"]) == 1


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.floats(min_value=0.0, max_value=3.0), min_size=1, max_size=40),
       names=st.lists(st.sampled_from(["progress", "iteration", "step", "waiting", "leaving"]), min_size=40,
                      max_size=40))
def test_the_file_never_lags_the_latest_event_by_a_second_and_writes_are_spaced(tmp_path_factory, gaps, names):
    clock = Clock()
    sink, _, path = make(tmp_path_factory.mktemp("hb"), clock)
    sink(READY)
    write_times = [clock.now]
    for gap, name in zip(gaps, names, strict=False):
        clock.now += gap
        sink({"event": name, "iteration": 1})
        stamped = read_heartbeat(path)["time"]
        assert clock.now - stamped < 1.0
        if stamped != write_times[-1]:
            assert name == "leaving" or stamped - write_times[-1] >= 1.0
            write_times.append(stamped)
