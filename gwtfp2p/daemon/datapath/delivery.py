"""Progress, not pings: which next hops take our outputs and deliver no gradient back.

Pure bookkeeping, times passed in. A relay can answer every ping and swallow every forward; pings alone
never fail it. The outbox notes every gradient that comes back (``delivered``, by the hop that took the
output); the recovery notes every probe that found a late hop alive (``answered_late``). A hop that
answered ``limit`` such probes in a row and delivered nothing since the oldest late output was sent, while
another replica of its stage did deliver since then, is unproductive: the recovery then excludes it
(``swarm.exclusions``) and resends its outputs elsewhere. (When no replica of a stage delivers, the stage
is stuck, e.g. in its aggregation, and nobody is to blame here.)
"""

from __future__ import annotations

import math


class DeliveryWatch:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # answered probes about late outputs before a hop counts as unproductive
        self._delivered_at: dict[str, float] = {}
        self._late_probes: dict[str, int] = {}

    def delivered(self, peer: str, now: float) -> None:
        """A gradient came back from ``peer`` (for an output it took)."""
        self._delivered_at[peer] = now
        self._late_probes.pop(peer, None)

    def delivered_since(self, peer: str, since: float) -> bool:
        return self._delivered_at.get(peer, -math.inf) >= since

    def answered_late(self, peer: str, oldest_sent_at: float) -> bool:
        """``peer`` answered a probe about late outputs (the oldest sent at ``oldest_sent_at``); True once it
        answered ``limit`` of them and delivered nothing since that output was sent."""
        if self._delivered_at.get(peer, -math.inf) >= oldest_sent_at:
            self._late_probes.pop(peer, None)
            return False
        self._late_probes[peer] = self._late_probes.get(peer, 0) + 1
        return self._late_probes[peer] >= self.limit
