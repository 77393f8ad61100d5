"""A swarm of containers from one image: a data holder and two relays (``--stage auto``) on the host network.

``run_swarm`` starts them as a volunteer would (the image's entrypoint and defaults, ``--stop-timeout``
longer than the daemon's grace), waits until each is healthy (the HEALTHCHECK on the heartbeat
file), checks from inside the data holder that it runs as UID 10001 under tini with its identity in
/id, checks with ``gwtf status`` (run from the image) that training advances and that the two
replicas of stage 1 agree, stops them with ``docker stop`` and checks that each left cleanly (exit 0).
Every wait has a deadline; ``Containers.remove`` removes them and their volumes whatever happened.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from engine import StepFailed, docker, tail

READY_TIMEOUT_S = 600.0  # deadlines, not expected times (ready took 51-90 s at a load average of 20)
TRAINING_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60  # docker stop's grace before SIGKILL: the daemon's --grace-s (10 s) + ~10-20 s to exit
STATUS_TIMEOUT_S = 300.0  # a container start, torch's import and a DHT read (over 120 s at a load of 27)
MAX_ITERATIONS = 600  # 4 min at the 2.5 iterations/s measured at a load average of 20 on 2 cores
POLL_S = 1.0
NODE_ARGS = ("--json", "--tick-s", "0.5", "--heartbeat-s", "2")
# Loopback only: peers dial the addresses others announce, and this machine may send nothing beyond it.
HOST = "127.0.0.1"
RUN_SPEC = {"model_family": "gpt2", "model_preset": "tiny", "n_stages": 1, "seed": 0, "lr": 3e-3,
            "microbatch_size": 4, "seq_len": 64, "microbatches_per_dh": 4}  # one stage: both relays serve it


def seconds_since(started_at: str, when: float) -> float:
    """``when`` (epoch seconds) minus Docker's RFC 3339 ``StartedAt`` (nanoseconds cut to micro)."""
    stamp = started_at.rstrip("Z")
    whole, _, fraction = stamp.partition(".")
    start = datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}+00:00")
    return when - start.timestamp()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Node:
    name: str
    ready: dict[str, Any] = field(default_factory=dict)
    ready_s: float = 0.0  # container start -> ready event
    healthy_s: float = 0.0  # container start -> first seen healthy
    stop_s: float = 0.0
    exit_code: int | None = None


class Containers:
    """The containers of one run, labelled with its id so that they can all be found and removed."""

    def __init__(self, image: str, run_id: str) -> None:
        self.image = image
        self.label = f"gwtf-ci={run_id}"
        self.prefix = f"gwtf-ci-{run_id}"
        self.names: list[str] = []
        self.volumes: set[str] = set()
        self.status_calls = 0

    def run(self, role: str, *args: str, mounts: tuple[str, ...] = ()) -> Node:
        name = f"{self.prefix}-{role}"
        volume_args = [arg for mount in mounts for arg in ("--volume", mount)]
        docker("run", "--detach", "--name", name, "--label", self.label, "--network", "host",
               "--stop-timeout", str(STOP_TIMEOUT_S), *volume_args, self.image, "join", *args,
               what=f"docker run {name}", timeout_s=60)
        self.names.append(name)
        self.volumes |= {m["Name"] for m in self.inspect(name)["Mounts"] if m.get("Type") == "volume"}
        return Node(name)

    def inspect(self, name: str) -> dict[str, Any]:
        return json.loads(docker("inspect", name, what=f"docker inspect {name}").stdout)[0]

    def logs(self, name: str) -> tuple[str, str]:
        result = docker("logs", name, what=f"docker logs {name}", timeout_s=30)
        return result.stdout, result.stderr

    def events(self, name: str) -> list[dict[str, Any]]:
        events = []
        for line in self.logs(name)[0].splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events

    def wait_healthy(self, node: Node) -> None:
        """Until the HEALTHCHECK passes; the ready event and both delays from the container's start."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            state = self.inspect(node.name)["State"]
            if state["Status"] != "running":
                raise StepFailed(f"{node.name} is {state['Status']} (exit {state.get('ExitCode')}) before it was "
                                 f"healthy:\n{tail(self.logs(node.name)[1])}")
            if state.get("Health", {}).get("Status") == "healthy":
                node.healthy_s = seconds_since(state["StartedAt"], time.time())
                break
            if time.monotonic() > deadline:
                raise StepFailed(f"{node.name} not healthy within {READY_TIMEOUT_S:.0f} s (health: "
                                 f"{json.dumps(state.get('Health'))[-800:]}):\n{tail(self.logs(node.name)[1])}")
            time.sleep(POLL_S)
        ready = [e for e in self.events(node.name) if e.get("event") == "ready"]
        if not ready:
            raise StepFailed(f"{node.name} is healthy but printed no ready event")
        node.ready = ready[0]
        node.ready_s = seconds_since(state["StartedAt"], node.ready["time"])

    def status(self, maddr: str) -> dict[str, Any]:
        """``gwtf status --json`` from a throw-away container of the image on the host network (labelled:
        if it outlives its deadline, ``remove`` finds it)."""
        self.status_calls += 1
        name = f"{self.prefix}-status{self.status_calls}"
        result = docker("run", "--rm", "--name", name, "--label", self.label, "--network", "host", self.image,
                        "status", "--initial-peers", maddr, "--json", "--timeout-s", "60", what="gwtf status",
                        timeout_s=STATUS_TIMEOUT_S)
        return json.loads(result.stdout)

    def exec(self, name: str, *cmd: str) -> str:
        return docker("exec", name, *cmd, what=f"docker exec {name} {' '.join(cmd)}", timeout_s=30).stdout.strip()

    def stop(self, nodes: list[Node]) -> None:
        """``docker stop`` (SIGTERM, SIGKILL after STOP_TIMEOUT_S); each node's exit code and stop time."""
        for node in nodes:
            started = time.monotonic()
            docker("stop", node.name, what=f"docker stop {node.name}", timeout_s=STOP_TIMEOUT_S + 30)
            node.stop_s = time.monotonic() - started
            node.exit_code = self.inspect(node.name)["State"]["ExitCode"]

    def report(self, lines: int = 15) -> str:
        """The end of every container's stderr and its last events: what a failed run shows."""
        parts = []
        for name in self.names:
            try:
                stdout, stderr = self.logs(name)
            except StepFailed as e:
                parts.append(f"--- {name}: {e}")
                continue
            events = [line for line in stdout.splitlines() if line.startswith("{")][-5:]
            parts.append(f"--- {name} (last events, then stderr)\n" + "\n".join(e[:300] for e in events) + "\n"
                         + tail(stderr, lines))
        return "\n".join(parts)

    def remove(self) -> list[str]:
        """Remove every container of the run and its volumes; what is still there afterwards (should be none)."""
        found = docker("ps", "--all", "--quiet", "--filter", f"label={self.label}", what="docker ps").stdout.split()
        if found:
            docker("rm", "--force", "--volumes", *found, what="docker rm", timeout_s=120)
        left = docker("ps", "--all", "--quiet", "--filter", f"label={self.label}", what="docker ps").stdout.split()
        existing = set(docker("volume", "ls", "--quiet", what="docker volume ls").stdout.split())
        return left + sorted(self.volumes & existing)


def stage_of(status: dict[str, Any], k: int = 1) -> dict[str, Any]:
    """Stage ``k`` of a status (no replicas: an empty one)."""
    return next((s for s in status["stages"] if s["stage"] == k), {"replicas": [], "in_sync": False, "hashes": {}})


def replicas_agree(status: dict[str, Any], relays: set[str]) -> bool:
    """Stage 1 is served by exactly the two relays, both compared at a common step and in sync."""
    stage = stage_of(status)
    if set(stage["replicas"]) != relays or not stage["in_sync"]:
        return False
    verdicts = stage.get("sync", {}).get("replicas", {})
    return all(v.get("status") == "in_sync" for v in verdicts.values()) if verdicts else True


def poll_status(containers: Containers, maddr: str, until: Any, what: str, timeout_s: float) -> dict[str, Any]:
    """``gwtf status`` every POLL_S until ``until(status)``; StepFailed naming ``what`` past the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = containers.status(maddr)
        if until(status):
            return status
        if time.monotonic() > deadline:
            raise StepFailed(f"{what}: not within {timeout_s:.0f} s; last status: {json.dumps(status)[-2500:]}")
        time.sleep(POLL_S)


def wait_event(containers: Containers, node: Node, name: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = [e for e in containers.events(node.name) if e.get("event") == name]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise StepFailed(f"{node.name}: no {name} event within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def check_training(containers: Containers, holder: Node, maddr: str, relays: set[str]) -> dict[str, Any]:
    """With ``gwtf status``: training runs, and once the data holder has trained MAX_ITERATIONS, the
    iteration has advanced and both replicas of stage 1 report the same state at the last step.
    (While the swarm trains at several iterations a second, two replicas' records rarely hold a
    common step to compare.)"""
    first = poll_status(containers, maddr, lambda s: s["iteration"] >= 1, "training started", TRAINING_TIMEOUT_S)
    if first["iteration"] >= MAX_ITERATIONS:
        raise StepFailed(f"training ended before the first status read: raise MAX_ITERATIONS ({MAX_ITERATIONS})")
    done = wait_event(containers, holder, "training_done", TRAINING_TIMEOUT_S)
    final = poll_status(containers, maddr, lambda s: s["iteration"] > first["iteration"] and replicas_agree(s, relays),
                        "training advanced and stage 1's replicas in sync", TRAINING_TIMEOUT_S)
    losses = [(e["time"], e["loss"]) for e in containers.events(holder.name) if e.get("event") == "iteration"]
    rate = (len(losses) - 1) / (losses[-1][0] - losses[0][0]) if len(losses) > 1 else 0.0
    return {"iteration_first": first["iteration"], "iteration_final": final["iteration"],
            "iteration_done": done["iteration"], "iterations_per_s": round(rate, 1),
            "loss_first": losses[0][1] if losses else None, "loss_last": final["loss"],
            "stage_1_hashes": sorted(set(stage_of(final)["hashes"].values()))}


def check_container_setup(containers: Containers, node: Node) -> dict[str, str]:
    """What the image promises, seen from inside a running node: user, init, identity, heartbeat."""
    seen = {"uid": containers.exec(node.name, "id", "-u"), "pid1": containers.exec(node.name, "cat", "/proc/1/comm"),
            "identity": containers.exec(node.name, "sh", "-c", "test -s /id/key && echo present"),
            "health": containers.exec(node.name, "python", "-m", "gwtf_cli.heartbeat", "/run/gwtf/heartbeat.json")}
    if seen["uid"] != "10001" or seen["pid1"] != "tini" or seen["identity"] != "present":
        raise StepFailed(f"{node.name}: expected UID 10001, tini as PID 1 and /id/key; saw {seen}")
    return seen


def run_swarm(containers: Containers, spec_dir: Path) -> dict[str, Any]:
    """The whole check; returns its figures. The caller removes the containers (``Containers.remove``)."""
    (spec_dir / "run_spec.json").write_text(json.dumps(RUN_SPEC))
    spec_dir.chmod(0o755)
    (spec_dir / "run_spec.json").chmod(0o644)
    port = free_port()
    holder = containers.run("dh", "--role", "data", "--host", HOST, "--port", str(port), "--run-spec",
                            "/spec/run_spec.json", "--min-nodes", "3", "--max-iterations", str(MAX_ITERATIONS),
                            *NODE_ARGS, mounts=(f"{spec_dir}:/spec:ro",))
    containers.wait_healthy(holder)
    maddr = f"/ip4/{HOST}/tcp/{port}/p2p/{holder.ready['peer_id']}"
    inside = check_container_setup(containers, holder)
    relays = [containers.run(f"relay{i}", "--stage", "auto", "--host", HOST, "--port", "0", "--initial-peers",
                             maddr, *NODE_ARGS) for i in (1, 2)]
    for relay in relays:
        containers.wait_healthy(relay)
    training = check_training(containers, holder, maddr, {r.ready["peer_id"] for r in relays})
    containers.stop([*relays, holder])
    unclean = [f"{n.name} exited {n.exit_code}" for n in (*relays, holder) if n.exit_code != 0]
    if unclean:
        raise StepFailed(f"not a clean leave: {unclean}; stderr of the first:\n"
                         f"{tail(containers.logs(unclean[0].split()[0])[1])}")
    nodes = [holder, *relays]
    return {"inside": inside, "training": training,
            "nodes": [{"name": n.name.rsplit("-", 1)[1], "stage": n.ready.get("stage"), "ready_s": round(n.ready_s, 1),
                       "healthy_s": round(n.healthy_s, 1), "stop_s": round(n.stop_s, 1), "exit": n.exit_code}
                      for n in nodes]}
