"""The image's entrypoint (docker/entrypoint.sh) and Dockerfile, without Docker.

The entrypoint runs here with a stand-in ``gwtf`` that records its arguments: ``join`` gets the
container's defaults first and the user's flags after them, and click (the real ``gwtf join``
parser) lets the user's win; a heartbeat-file bootstrap adds the live peer's address or refuses a
stale one; other commands pass through. The Dockerfile uses only the classic builder's syntax.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from gwtf_cli.heartbeat import HeartbeatSink
from gwtf_cli.main import app

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"
DOCKERFILE = REPO / "docker" / "Dockerfile"
RECORDER = """#!/bin/sh
"{python}" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
"""


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "gwtf").write_text(RECORDER.format(python=sys.executable))
    (folder / "gwtf").chmod(0o755)
    (folder / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # for `python -m gwtf_cli...`
    (folder / "python").chmod(0o755)
    return folder


def entrypoint(bin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GWTF_DEVICE": "auto",
               "GWTF_HEARTBEAT_FILE": "/run/gwtf/heartbeat.json", **env}
    return subprocess.run(["sh", str(ENTRYPOINT), *args], env=environ, capture_output=True, text=True, timeout=60)


def parsed_join(argv: list[str]) -> dict:
    """The parameters the real ``gwtf join`` would run with (click's parser, nothing started)."""
    command = typer.main.get_command(app)
    join = command.get_command(None, "join")  # type: ignore[attr-defined]
    assert argv[0] == "join"
    return join.make_context("join", argv[1:]).params


def test_join_gets_the_container_defaults_and_the_users_flags_win(bin_dir):
    result = entrypoint(bin_dir, "join", "--stage", "auto", "--port", "4000", "--device", "cuda:1")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)
    params = parsed_join(argv)
    assert params["host"] == "0.0.0.0" and params["identity"] == "/id/key"
    assert params["checkpoint_dir"] == "/checkpoints" and params["heartbeat_file"] == "/run/gwtf/heartbeat.json"
    assert params["port"] == 4000 and params["device"] == "cuda:1" and params["stage"] == "auto"
    assert parsed_join(json.loads(entrypoint(bin_dir, "join").stdout))["port"] == 31337


def test_other_commands_pass_through_unchanged(bin_dir):
    result = entrypoint(bin_dir, "status", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/x", "--json")
    assert json.loads(result.stdout) == ["status", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/x", "--json"]
    assert json.loads(entrypoint(bin_dir).stdout) == []


def test_a_live_heartbeat_bootstraps_and_a_missing_one_refuses(bin_dir, tmp_path):
    heartbeat = tmp_path / "dh" / "heartbeat.json"
    env = {"GWTF_BOOTSTRAP_HEARTBEAT": str(heartbeat), "GWTF_BOOTSTRAP_ADDR": "/dns4/dataholder/tcp/31337"}
    refused = entrypoint(bin_dir, "join", "--stage", "auto", **env)
    assert refused.returncode == 1 and refused.stdout == "" and "no live bootstrap peer" in refused.stderr
    assert "no heartbeat file" in refused.stderr  # the check itself ran and said why
    HeartbeatSink(lambda _e: None, heartbeat)({"event": "ready", "peer_id": "12D3KooWLive", "maddrs": []})
    joined = entrypoint(bin_dir, "join", "--stage", "auto", **env)
    assert joined.returncode == 0, joined.stderr
    params = parsed_join(json.loads(joined.stdout))
    assert params["initial_peers"] == ["/dns4/dataholder/tcp/31337/p2p/12D3KooWLive"]


def test_the_dockerfile_needs_no_buildkit_and_keeps_its_promises():
    text = DOCKERFILE.read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    for pattern in (r"--mount", r"<<", r"--link", r"--chmod", r"--chown", r"--parents", r"--exclude"):
        assert not [i for i in instructions if re.search(pattern, i)], f"BuildKit-only syntax: {pattern}"
    assert not text.startswith("# syntax=")
    assert re.search(r"^USER 10001:10001$", text, re.M) and re.search(r'^VOLUME \["/id", "/checkpoints"\]$', text, re.M)
    assert re.search(r'^ENTRYPOINT \["tini", "--", "gwtf-entrypoint"\]$', text, re.M)
    assert "gwtf_cli.heartbeat" in text and "HEALTHCHECK" in text
    assert os.access(ENTRYPOINT, os.X_OK)
