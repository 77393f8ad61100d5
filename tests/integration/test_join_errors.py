"""``gwtf join`` fails clearly, within 30 s, on each usual mistake (issue 13): one line on stderr naming the
flag or the address, and a non-zero exit. Triggered on purpose, each on a real network stack: initial
peers nobody answers at (an address in a network namespace of its own, where nobody listens), a peer of
another protocol version, a ``--run-spec`` of another run than the swarm's, a port in use, p2pd unable to
start (its own message shown), an ``--announce`` address nobody can dial (checked by the swarm's peers
from another namespace), and a stage the run does not have."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gwtfp2p.daemon.lifecycle.preflight import DAEMON_PROTOCOL
from tests.integration.netns.other_version_peer import OTHER_VERSIONS
from tests.integration.netns.topology import Topology
from tests.integration.swarm import REPO_ROOT, Daemon, Swarm

pytestmark = pytest.mark.timeout(420)
WITHIN_S = 30.0
ONE_STAGE = {"model_family": "gpt2", "model_preset": "tiny", "n_stages": 1, "seed": 3, "microbatch_size": 2,
             "seq_len": 16, "microbatches_per_dh": 2}
SOME_PEER = "12D3KooWH7NYvRnFXHzCrrrhyiT2MK8E6DTS2SnMq9GLCZ4APq4w"


def failure(daemon: Daemon) -> tuple[int, str, float]:
    """(exit code, the error line, seconds from start to exit) of a daemon expected to fail."""
    code = daemon.popen.wait(timeout=WITHIN_S + 30)
    seconds = time.time() - daemon.started_at
    lines = [line for line in daemon.stderr_path.read_text(errors="replace").splitlines() if "gwtf join:" in line]
    return code, lines[-1] if lines else daemon.stderr_tail(), seconds


def assert_fails_clearly(daemon: Daemon, *fragments: str) -> str:
    code, line, seconds = failure(daemon)
    print(f"{daemon.name}: exit {code} after {seconds:.1f} s: {line}")
    assert code != 0, line
    assert seconds < WITHIN_S, f"{daemon.name} took {seconds:.1f} s: {line}"
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


@pytest.fixture(scope="module")
def spec_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("specs")
    ours, other = folder / "one_stage.json", folder / "other_seed.json"
    ours.write_text(json.dumps(ONE_STAGE))
    other.write_text(json.dumps({**ONE_STAGE, "seed": 4}))
    return ours, other


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, spec_files: tuple[Path, Path]) -> Iterator[tuple[Swarm, Daemon]]:
    """A data holder on 127.0.0.1 training nothing yet (no relay): the swarm the mistakes are made against."""
    swarm = Swarm(tmp_path_factory.mktemp("errors"))
    try:
        yield swarm, swarm.start_data_holder("dh0", "--run-spec", str(spec_files[0]))
    finally:
        swarm.close()


def test_initial_peers_nobody_answers_at_name_the_address_and_what_was_tried(running) -> None:
    swarm, _ = running
    with Topology() as topo:
        lonely = topo.public_host("lonely")
        nobody = f"/ip4/10.77.0.99/tcp/31337/p2p/{SOME_PEER}"
        relay = swarm.spawn("to-nobody", "--initial-peers", nobody, "--host", "0.0.0.0",
                            env={"GWTF_NETNS": lonely.netns})
        line = assert_fails_clearly(relay, "none of the initial peers answered", "10.77.0.99:31337", "--initial-peers")
        assert "no route" in line or "no answer" in line


def test_a_peer_of_another_protocol_version_is_named_with_both_versions(running) -> None:
    swarm, _ = running
    peer = subprocess.Popen([sys.executable, "-m", "tests.integration.netns.other_version_peer"], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        maddr = json.loads(peer.stdout.readline())["maddrs"][0]
        relay = swarm.spawn("to-other-version", "--initial-peers", maddr)
        theirs = OTHER_VERSIONS["daemon"]
        assert_fails_clearly(relay, f"speaks protocol versions daemon {theirs} (this node: {DAEMON_PROTOCOL})",
                             "--initial-peers")
    finally:
        peer.kill()
        peer.wait(timeout=30)


def test_a_run_spec_of_another_run_than_the_swarms(running, spec_files) -> None:
    swarm, dh = running
    relay = swarm.spawn("other-run", "--initial-peers", dh.maddr, "--run-spec", str(spec_files[1]))
    assert_fails_clearly(relay, "--run-spec: the swarm at --initial-peers trains run", "seed 3", "seed 4",
                         "--new-run")


def test_a_port_in_use_names_the_flag(running) -> None:
    swarm, _ = running
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        dh = swarm.spawn("port-taken", "--role", "data", "--port", str(port))
        assert_fails_clearly(dh, "the listen port is taken", "--port", str(port))


def test_p2pd_failing_to_start_shows_its_own_message(running) -> None:
    swarm, _ = running
    dh = swarm.spawn("p2pd-fails", "--role", "data", "--host", "10.254.254.254")
    assert_fails_clearly(dh, "--host", "failed to listen on any addresses", "cannot assign requested address")


def test_an_announce_address_nobody_can_dial_is_refused_after_the_swarms_check(running, spec_files) -> None:
    swarm, _ = running
    with Topology() as topo:
        home, away = topo.public_host("dh"), topo.public_host("relay")
        dh = swarm.spawn("dh-ns", "--role", "data", "--host", "0.0.0.0", "--run-spec", str(spec_files[0]),
                         env={"GWTF_NETNS": home.netns}).wait_ready()
        bootstrap = next(m for m in dh.ready["maddrs"] if home.address in m)
        relay = swarm.spawn("bad-announce", "--initial-peers", bootstrap, "--host", "0.0.0.0", "--port", "4444",
                            "--announce", "/ip4/10.77.0.250/tcp/4444", env={"GWTF_NETNS": away.netns})
        assert_fails_clearly(relay, "--announce: none of the 1 peer(s) that checked could dial",
                             "/ip4/10.77.0.250/tcp/4444", "port forwarding")
        dh.kill_group()


def test_a_stage_the_run_does_not_have(running) -> None:
    swarm, dh = running
    relay = swarm.spawn("no-stage", "--initial-peers", dh.maddr, "--stage", "5")
    assert_fails_clearly(relay, "--stage", "stages 1..1", "got 5")
