"""CPU time a local swarm used between two moments: the host's busy seconds and each daemon's.

A swarm on one machine shares that machine's cores, which a swarm of GPUs does not: its figures mean
little without knowing how busy the cores were. ``sample`` reads the host's CPU counters (all cores
summed) and the CPU seconds of each daemon's process group (the daemon, its DHT process and p2pd;
user and system, reaped children included); ``cpu_between`` turns two samples into the window's
figures. For benchmarks (``benchmarks/bench_bandwidth.py``) and tests: psutil comes with the ``dev``
extra, which a volunteer's install does not have.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

from gwtfp2p.localswarm.processes import Daemon, group_members


@dataclass(frozen=True, kw_only=True)
class CpuSample:
    at_s: float
    """Wall-clock time of the sample (``time.time()``, the clock of the daemons' events)."""
    host_busy_s: float
    """The host's CPU seconds spent on anything but idling and waiting for I/O, all cores summed."""
    host_total_s: float
    """The host's CPU seconds of every kind, all cores summed."""
    cores: int
    """Logical cores the host has."""
    node_cpu_s: dict[str, float]
    """Each daemon's process group's CPU seconds so far, by daemon name."""


def group_cpu_s(pgid: int) -> float:
    """User + system seconds of the live members of process group ``pgid``, with their reaped children's."""
    total = 0.0
    for pid in group_members(pgid):
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def sample(daemons: Iterable[Daemon]) -> CpuSample:
    """The host's and each daemon's CPU counters now."""
    host = psutil.cpu_times()
    idle = host.idle + getattr(host, "iowait", 0.0)
    total = sum(host)
    return CpuSample(at_s=time.time(), host_busy_s=total - idle, host_total_s=total,
                     cores=psutil.cpu_count() or 1,
                     node_cpu_s={d.name: group_cpu_s(d.popen.pid) for d in daemons})


def cpu_between(before: CpuSample, after: CpuSample) -> dict:
    """The window between two samples: its wall seconds, the host's busy CPU seconds and the share of
    its cores they took, and each daemon's CPU seconds (daemons in both samples only)."""
    window_s = after.at_s - before.at_s
    if window_s <= 0:
        raise ValueError(f"samples out of order: {before.at_s} then {after.at_s}")
    busy_s = after.host_busy_s - before.host_busy_s
    total_s = after.host_total_s - before.host_total_s
    return {"window_s": window_s, "cores": after.cores, "host_busy_s": busy_s,
            "host_utilization": busy_s / total_s if total_s > 0 else 0.0,
            "node_cpu_s": {name: after.node_cpu_s[name] - spent for name, spent in before.node_cpu_s.items()
                           if name in after.node_cpu_s}}
