"""A local swarm's transfer figures, read from its daemons' ``progress`` events (``traffic``).

Each daemon reports the transfers it sent and had acknowledged, and their wire bytes, by kind
(``daemon/swarm/sending.py:Traffic``) every heartbeat. ``swarm_traffic`` sums the swarm's latest
reports; ``bytes_per_microbatch_hop`` is what one microbatch costs a hop (forward + backward).
``compute_ms`` reads each daemon's measured compute time per microbatch from the same reports.
"""

from __future__ import annotations

import contextlib
import statistics
from collections import Counter

from gwtfp2p.localswarm.processes import Daemon

REPORT_WAIT_S = 8.0  # a live daemon reports every heartbeat (2 s in the local swarms' FAST settings)


def swarm_traffic(daemons: list[Daemon], since: float, wait_s: float = REPORT_WAIT_S) -> dict[str, int]:
    """The daemons' counters summed: each one's first report at or after ``since`` (its clock's time), or
    its last one if none comes within ``wait_s`` (a stopped or crashed daemon)."""
    totals: Counter[str] = Counter()
    for daemon in daemons:
        with contextlib.suppress(TimeoutError, RuntimeError):
            daemon.wait_for(lambda e: e.get("event") == "progress" and e["time"] >= since and "traffic" in e,
                            wait_s, "a progress report")
        reports = [e["traffic"] for e in daemon.of("progress") if "traffic" in e]
        if reports:
            totals.update(reports[-1])
    return dict(totals)


def bytes_per_microbatch_hop(totals: dict[str, int]) -> float | None:
    """Forward + backward wire bytes of one microbatch over one hop, the mean over every hop taken
    (None: nothing was sent)."""
    if not totals.get("forwards") or not totals.get("backwards"):
        return None
    return totals["forward_bytes"] / totals["forwards"] + totals["backward_bytes"] / totals["backwards"]


def compute_ms(daemons: list[Daemon], since: float) -> dict[str, float]:
    """Each daemon's forward + backward milliseconds per microbatch (its compute thread's wall time, the
    estimate it publishes): the median of its reports at or after ``since`` that have one; daemons
    without such a report are left out."""
    figures = {}
    for daemon in daemons:
        values = [e["compute_ms"] for e in daemon.of("progress")
                  if e["time"] >= since and isinstance(e.get("compute_ms"), (int, float)) and e["compute_ms"] > 0]
        if values:
            figures[daemon.name] = float(statistics.median(values))
    return figures
