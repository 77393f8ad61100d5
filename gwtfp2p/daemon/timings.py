"""Every period, deadline and floor of the daemon in one frozen, documented config: ``Timings``.

Part of ``NodeConfig`` (``config.py``); the CLI sets the four the user may (``TIMING_FLAGS``), the
rest are stated here once. Validated once; an error names the flag (or the field) and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from gwtfp2p.config import require, require_positive

TIMING_FLAGS = ("tick_s", "heartbeat_s", "grace_s", "startup_timeout_s")  # the ones ``gwtf join`` takes


def _flag(timing: str) -> str:
    """How an error names a timing: its ``gwtf join`` flag, else its field (set in code, not on the CLI)."""
    return f"--{timing.replace('_', '-')}" if timing in TIMING_FLAGS else f"Timings.{timing}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Timings:
    """Every period, deadline and floor of the daemon, in seconds (counts say so in their name)."""

    tick_s: float = 1.0
    """Seconds between flow-protocol ticks (``--tick-s``)."""
    heartbeat_s: float = 5.0
    """Seconds between DHT heartbeats; a record expires after two (``--heartbeat-s``)."""
    grace_s: float = 10.0
    """A leaving node finishes its current iteration within this (``--grace-s``)."""
    shutdown_s: float = 30.0
    """... and is gone within this much more (announced, closed, its DHT stopped); past it, it logs the tasks
    still pending and exits with code 1 (``lifecycle/shutdown_watch.py``)."""
    startup_timeout_s: float = 60.0
    """Deadline of the DHT start and of finding the run's spec in it (``--startup-timeout-s``)."""
    timeout_factor: float = 4.0
    """Every adaptive deadline is this multiple of what the work should take (RTT, size / bandwidth)."""
    transfer_floor_s: float = 2.0
    """No transfer or liveness-verdict ping deadline is shorter than this."""
    probe_floor_s: float = 5.0
    """No routine ping (a first contact, the periodic RTT probes, placement) gives up sooner than this: a
    failed one only makes the peer a suspect, whom a verdict ping then checks."""
    backward_floor_s: float = 2.0
    """No deadline for a gradient to come back is shorter than this."""
    backward_cap_s: float = 120.0
    """... nor longer than this, however often the next hop answered a probe."""
    query_floor_s: float = 1.0
    """No deadline for the answers to a recovery query (``Where``) is shorter than this."""
    message_timeout_s: float = 5.0
    """Deadline of one small message (flow, control, membership, recovery)."""
    connect_timeout_s: float = 5.0
    """Deadline of dialling a peer at the addresses its record publishes."""
    retry_delays_s: tuple[float, ...] = (0.2, 1.0)
    """Pauses between the tries of a failed transfer or control message (one try per pause, then give up)."""
    unreachable_retry_delays_s: tuple[float, ...] = (0.2,)
    """The same after a dial error: one more try, then it is the recovery's turn."""
    deadline_check_s: float = 0.25
    """How often kept outputs are checked for a gradient past its deadline."""
    retry_nobody_s: float = 1.0
    """A microbatch no replica of the next stage took is offered again after this."""
    probe_after_s: float = 0.5
    """A replica whose aggregation message we wait for longer than this is probed ..."""
    probe_every_s: float = 1.0
    """... at most this often."""
    unannounced_s: float = 10.0
    """An online same-part peer that has not announced its membership is waited for this long."""
    aggregation_timeout_s: float = 60.0
    """Last resort: members silent this long in one aggregation are dropped from it."""
    refused_retry_s: float = 0.5
    """Pause before an aggregation message a member refused (it was starting up) is sent again."""
    norm_resend_s: float = 2.0
    """A part's squared gradient norm (or an iteration's end) not answered for this long is sent again."""
    redo_timeout_s: float = 20.0
    """A survivor redoing a lost replica's contribution waits this long for its neighbours' tensors."""
    closed_poll_s: float = 0.5
    """How often a relay waiting for an iteration's end also checks whether it ended elsewhere."""
    state_wait_s: float = 8.0
    """A state download waits at most this long for the step in progress to finish."""
    wait_for_step_s: float = 120.0
    """A forward of the next iteration waits at most this long for this stage's step."""
    report_every_s: float = 5.0
    """Period of the ``waiting`` events while a node or the swarm waits."""
    first_useful_poll_s: float = 0.05
    """How often a relay checks for its first finished backward (the ``first_microbatch`` event)."""
    orphan_confirm_s: float = 20.0
    """A joiner that finds no live replica of its stage in a running swarm reads the DHT again for this long
    before it restores the stage (checkpoint or initial weights): records that lapsed under load must not fork it."""
    fetch_timeout_s: float = 120.0
    """Deadline of one state (or step replay) download."""
    reserved_wait_s: float = 30.0
    """A joiner replays up to its reserved iteration for at most this long (the replicas wait there)."""
    step_poll_s: float = 0.05
    """How often a joiner fetches the steps its stage takes while it catches up."""
    spec_poll_s: float = 0.5
    """How often a joining node looks for the run's spec in the DHT."""
    spec_ttl_s: float = 7 * 24 * 3600.0
    """Lifetime of the run's spec record in the DHT."""
    reach_timeout_s: float = 10.0
    """Deadline of the reachability check's probe start, record reads and each dial-back answer."""
    outage_after_s: float = 10.0
    """No DHT round succeeded and no peer answered for this long: the node lost the swarm (an outage)."""
    reconnect_every_s: float = 2.0
    """During an outage the initial and last known peers are dialled again after this, then less often ..."""
    reconnect_max_s: float = 5.0
    """... at most this far apart."""

    def __post_init__(self) -> None:
        for name in ("tick_s", "heartbeat_s", "startup_timeout_s", "shutdown_s", "timeout_factor", "transfer_floor_s",
                     "probe_floor_s", "backward_floor_s", "backward_cap_s", "query_floor_s", "message_timeout_s",
                     "connect_timeout_s", "deadline_check_s", "retry_nobody_s", "probe_after_s", "probe_every_s",
                     "unannounced_s", "aggregation_timeout_s", "refused_retry_s", "norm_resend_s", "closed_poll_s",
                     "redo_timeout_s", "state_wait_s",
                     "wait_for_step_s", "report_every_s", "first_useful_poll_s", "orphan_confirm_s", "fetch_timeout_s",
                     "reserved_wait_s", "step_poll_s", "spec_poll_s", "spec_ttl_s", "reach_timeout_s",
                     "outage_after_s", "reconnect_every_s", "reconnect_max_s"):
            require_positive(getattr(self, name), _flag(name))
        require(self.grace_s >= 0, "--grace-s", "must be >= 0")
        require(self.backward_cap_s >= self.backward_floor_s, _flag("backward_cap_s"),
                "must be >= Timings.backward_floor_s")
        for name in ("retry_delays_s", "unreachable_retry_delays_s"):
            delays = getattr(self, name)
            require(all(isinstance(d, (int, float)) and 0 <= d < 60 for d in delays), _flag(name),
                    f"pauses between tries must be within [0, 60) s, got {delays!r}")

    @property
    def probe_s(self) -> float:
        """Period of the RTT probes of flow neighbours (their edge costs)."""
        return max(1.0, 4 * self.tick_s)
