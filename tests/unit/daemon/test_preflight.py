"""Checks before a node joins (``lifecycle/preflight.py``) and the record's ``recent_hashes`` (``self_report``)."""

from __future__ import annotations

import asyncio

import pytest
from hivemind.proto import runtime_pb2

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.lifecycle.preflight import (
    DAEMON_PROTOCOL,
    PROTOCOL_VERSIONS,
    IncompatibleVersion,
    OtherRun,
    check_same_run,
    check_versions,
    mismatch,
)
from gwtfp2p.daemon.lifecycle.self_report import StepHashes
from gwtfp2p.dht.records import MAX_RECENT_HASHES
from gwtfp2p.transport.hello import Hello

A = "12D3KooWH7NYvRnFXHzCrrrhyiT2MK8E6DTS2SnMq9GLCZ4APq4w"
B = "QmWTgR67LqQ56U9XX4s56i6GnMWirn8jfteNxY8KciZxMp"


class FakeP2P:
    """Answers ``hello`` with the versions given per peer; a peer absent from ``answers`` has no handler."""

    def __init__(self, answers: dict[str, dict[str, int]]) -> None:
        self.answers = answers

    async def call_protobuf_handler(self, peer, name, request, response_type):
        versions = self.answers.get(peer.to_base58())
        if versions is None:
            raise RuntimeError(f"protocol not supported: {name}")
        return runtime_pb2.ExpertResponse(metadata=Hello(versions=versions).model_dump_json().encode())


def peers(*ids: str) -> list[str]:
    return [f"/ip4/10.0.0.{i}/tcp/1/p2p/{peer}" for i, peer in enumerate(ids)]


def test_same_versions_pass_and_a_stock_bootstrap_is_skipped():
    p2p = FakeP2P({A: dict(PROTOCOL_VERSIONS)})
    assert asyncio.run(check_versions(p2p, peers(A, B), timeout_s=1.0)) == 1


def test_other_versions_stop_the_join_naming_them():
    p2p = FakeP2P({A: {**PROTOCOL_VERSIONS, "daemon": 99}})
    with pytest.raises(IncompatibleVersion, match=rf"daemon 99 \(this node: {DAEMON_PROTOCOL}\)"):
        asyncio.run(check_versions(p2p, peers(A), timeout_s=1.0))


def test_a_daemon_one_version_behind_is_refused():
    """E.g. version 1 daemons decode a flow ``Residual`` strictly and refuse version 2's, which carries
    ``paths``: the two versions cannot route together, so a joining node is stopped at the hello."""
    older = DAEMON_PROTOCOL - 1
    p2p = FakeP2P({A: {**PROTOCOL_VERSIONS, "daemon": older}})
    with pytest.raises(IncompatibleVersion, match=rf"daemon {older} \(this node: {DAEMON_PROTOCOL}\)"):
        asyncio.run(check_versions(p2p, peers(A), timeout_s=1.0))


def test_a_missing_version_counts_as_zero():
    assert mismatch({"wire": PROTOCOL_VERSIONS["wire"]}).startswith("daemon 0")
    assert mismatch(dict(PROTOCOL_VERSIONS)) == ""


def test_run_spec_of_another_run_is_refused_with_both_runs_named():
    swarm, mine = RunSpec(n_stages=2, seed=1), RunSpec(n_stages=2, seed=2)
    check_same_run(None, swarm)
    check_same_run(swarm, swarm)
    with pytest.raises(OtherRun, match=r"--run-spec: the swarm at --initial-peers trains run .* seed 1.* seed 2"):
        check_same_run(mine, swarm)


def test_the_record_carries_the_hashes_of_recent_steps_and_forgets_them_after_a_resync():
    hashes = StepHashes()
    for t in range(30):
        hashes.on_event({"event": "step", "iteration": t, "hash": f"{t:016x}"})
    hashes.on_event({"event": "progress", "iteration": 30})
    recent = hashes.recent()
    assert recent[-1] == (29, f"{29:016x}") and (18, f"{18:016x}") in recent and len(recent) == MAX_RECENT_HASHES
    hashes.on_event({"event": "iteration", "iteration": 30, "hash": "ff"})  # a data holder's step
    assert hashes.history()[-1] == (30, "ff")
    hashes.on_event({"event": "resynced", "iteration": 40})
    assert hashes.history() == [] and hashes.recent() == ()
