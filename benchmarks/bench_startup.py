"""Benchmark: start-up of the CLI, of a node and of the demo, this checkout against another one, side by side.

Measured from the outside, as a user would: ``gwtf --help`` (process start to exit); a node from
process start to its ``ready`` event (a data holder starting a run, then a relay joining it with
``--stage 1``, each a fresh interpreter); and the demo's own ``startup_s`` (from its start until every
relay is ready) with ``--iterations 3``. The two checkouts run alternately, repetition by repetition,
so a busy machine slows both alike. ``--baseline DIR`` is another checkout of gwtf (for example
``git worktree add /tmp/before <commit>``); it runs with this venv's interpreter and ``PYTHONPATH``
pointing at its ``gwtfp2p`` and ``cli`` (as ``gwtf_cli``). It measures; it asserts nothing.

    python benchmarks/bench_startup.py --baseline /tmp/before --runs 3 --json startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 300.0


def checkout_env(root: Path, shim_dir: Path) -> dict[str, str]:
    """The environment that makes ``gwtfp2p`` and ``gwtf_cli`` import from ``root``."""
    shim = shim_dir / root.name.replace("/", "_")
    shim.mkdir(parents=True, exist_ok=True)
    for name, target in (("gwtfp2p", root / "gwtfp2p"), ("gwtf_cli", root / "cli")):
        link = shim / name
        if not link.exists():
            link.symlink_to(target)
    return {**os.environ, "PYTHONPATH": str(shim), "GWTF_HIVEMIND_LOG_LEVEL": "CRITICAL"}


NEUTRAL_CWD = tempfile.gettempdir()  # ``python -m`` puts the working directory first on sys.path


def time_help(env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gwtf_cli.main", "--help"], env=env, check=True, cwd=NEUTRAL_CWD,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def start_node(env: dict[str, str], args: list[str], log: Path) -> tuple[subprocess.Popen, float, dict]:
    """A fresh ``gwtf join --json`` process: (process, seconds to its ready event, that event)."""
    started = time.perf_counter()
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "gwtf_cli.join_cmd", "--json", "--tick-s", "0.25",
                                 "--heartbeat-s", "2", *args], env=env, stdout=subprocess.PIPE, stderr=stderr,
                                cwd=NEUTRAL_CWD, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "ready":
            return proc, time.perf_counter() - started, event
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"no ready event from {args} (see {log})")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def time_nodes(env: dict[str, str], logs: Path) -> tuple[float, float]:
    """(data holder start -> ready, relay start -> ready) in seconds."""
    dh, dh_s, ready = start_node(env, ["--role", "data"], logs / "dh.stderr")
    try:
        relay, relay_s, _ = start_node(env, ["--stage", "1", "--initial-peers", ready["maddrs"][0]],
                                       logs / "relay.stderr")
        stop(relay)
    finally:
        stop(dh)
    return dh_s, relay_s


def time_demo(env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-m", "gwtf_cli.main", "demo", "--iterations", "3", "--json"], env=env,
                         cwd=NEUTRAL_CWD, check=True, capture_output=True, text=True, timeout=900)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["startup_s"])


def measure(root: Path, shim_dir: Path, logs: Path) -> dict[str, float]:
    env = checkout_env(root, shim_dir)
    dh_s, relay_s = time_nodes(env, logs)
    return {"help_s": time_help(env), "data_holder_ready_s": dh_s, "relay_ready_s": relay_s,
            "demo_startup_s": time_demo(env)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another gwtf checkout to compare with")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every measurement here")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="gwtf-startup-") as tmp:
        shim_dir, logs = Path(tmp) / "shims", Path(tmp)
        for run in range(args.runs):
            for name, root in (("baseline", args.baseline.resolve()), ("this", ROOT)):
                results[name].append(measure(root, shim_dir, logs))
                print(f"run {run} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in results[name][-1].items()),
                      flush=True)
    print(f"\n{'median of ' + str(args.runs) + ' runs':<24}{'baseline':>10}{'this':>10}{'this/baseline':>15}")
    for key in results["this"][0]:
        before = statistics.median(r[key] for r in results["baseline"])
        after = statistics.median(r[key] for r in results["this"])
        print(f"{key:<24}{before:>10.2f}{after:>10.2f}{after / before:>15.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
