"""``tests/integration/host_cpu.py``: the CPU a local swarm used between two samples, and a real sample of a busy
process group."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.integration.host_cpu import CpuSample, cpu_between, group_cpu_s, sample

pytestmark = pytest.mark.timeout(60)


def cpu(at_s: float, busy_s: float, total_s: float, **nodes: float) -> CpuSample:
    return CpuSample(at_s=at_s, host_busy_s=busy_s, host_total_s=total_s, cores=2, node_cpu_s=nodes)


def test_a_window_is_the_difference_of_its_two_samples():
    window = cpu_between(cpu(100.0, 50.0, 200.0, dh=1.0, r1=2.0),
                         cpu(110.0, 65.0, 220.0, dh=4.0, r1=2.5, late=9.0))
    assert window["window_s"] == pytest.approx(10.0)
    assert window["host_busy_s"] == pytest.approx(15.0)
    assert window["host_utilization"] == pytest.approx(0.75)  # 15 of the 2 cores' 20 s
    assert window["node_cpu_s"] == pytest.approx({"dh": 3.0, "r1": 0.5})  # a daemon in one sample only: left out
    assert window["cores"] == 2


def test_samples_out_of_order_are_refused():
    with pytest.raises(ValueError, match="out of order"):
        cpu_between(cpu(10.0, 1.0, 2.0), cpu(10.0, 1.0, 2.0))


def test_a_busy_process_group_is_counted_with_its_children():
    """A group leader that burns 0.3 s of CPU in a child it has reaped, then waits: its group's CPU counts
    the child; the host's busy time grows by at least as much."""
    script = ("import subprocess, sys; print('ready', flush=True); sys.stdin.readline(); "
              "subprocess.run([sys.executable, '-c', "
              "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass']); "
              "print('done', flush=True); sys.stdin.readline()")
    leader = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        daemon = SimpleNamespace(name="busy", popen=leader)
        assert leader.stdout.readline().strip() == "ready"
        before = sample([daemon])
        leader.stdin.write("go\n")
        leader.stdin.flush()
        assert leader.stdout.readline().strip() == "done"
        after = sample([daemon])
        window = cpu_between(before, after)
        assert window["node_cpu_s"]["busy"] >= 0.25
        assert window["host_busy_s"] >= window["node_cpu_s"]["busy"] - 0.05  # counters tick in 10 ms
        assert group_cpu_s(2**22 + 7) == 0.0  # no such group
    finally:
        leader.kill()
        leader.wait(timeout=30)
