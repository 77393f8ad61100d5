"""The swarm's pace as a data holder reports it: an iteration's tokens over the time since the previous
iteration closed.

An iteration's own span (first forward sent to last microbatch back) leaves out what the swarm waits
for between iterations: the relays' aggregation and step, the data holders' own, and the wait for
flow units. ``tokens_per_s`` (``Closed``, the status page, ``gwtf_tokens_per_second``, the demo) counts
them, so it is the rate at which the swarm trains tokens. Pure: the caller passes the clock's readings.
"""

from __future__ import annotations


class Pace:
    """When this node last closed an iteration, and the period and tokens/s of the one closing now."""

    def __init__(self) -> None:
        self.closed_at_s: float | None = None

    def close(self, now_s: float, began_at_s: float, tokens: int) -> tuple[float, float]:
        """``(period_s, tokens_per_s)`` of the iteration closing at ``now_s``: since the previous close, or
        since ``began_at_s`` (when this iteration began) for the first one this node closes."""
        start_s = began_at_s if self.closed_at_s is None else self.closed_at_s
        self.closed_at_s = now_s
        period_s = max(0.0, now_s - start_s)
        return period_s, tokens / period_s if period_s > 0 else 0.0
