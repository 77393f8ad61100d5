"""Who aggregates with whom: the members of one part (a stage's replicas, or the data holders).

Pure bookkeeping, no I/O. A member takes part in the aggregation of iterations
``from_iteration .. until_iteration`` (open-ended until it announces its last one). The
contributions of iteration t are expected from ``expected(t)``. A member seen dead is dropped and
remembered: lists of members pushed by others (``learn``) do not bring it back, only its own
membership announcement (``add``) does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Membership:
    from_iteration: int
    until_iteration: int | None = None

    def covers(self, iteration: int) -> bool:
        return self.from_iteration <= iteration and (self.until_iteration is None
                                                     or iteration <= self.until_iteration)


class MemberTable:
    """Members of one part, by peer id (this node included)."""

    def __init__(self, self_id: str, from_iteration: int) -> None:
        self.self_id = self_id
        self._members: dict[str, Membership] = {self_id: Membership(from_iteration)}
        self.dead: set[str] = set()

    def add(self, peer: str, from_iteration: int, until_iteration: int | None = None) -> bool:
        """Record (or update) a member from its own announcement; True if it was not known before."""
        known = self._members.get(peer)
        self._members[peer] = Membership(from_iteration, until_iteration)
        self.dead.discard(peer)
        return known is None

    def learn(self, peer: str, from_iteration: int) -> bool:
        """A member named by another member's list; True if added (unknown and not seen dead)."""
        if peer in self._members or peer in self.dead:
            return False
        self._members[peer] = Membership(from_iteration)
        return True

    def mark_dead(self, peer: str) -> None:
        if peer != self.self_id:
            self._members.pop(peer, None)
            self.dead.add(peer)

    def set_until(self, peer: str, until_iteration: int) -> None:
        member = self._members.get(peer)
        if member is not None:
            member.until_iteration = until_iteration

    def remove(self, peer: str) -> None:
        if peer != self.self_id:
            self._members.pop(peer, None)

    def get(self, peer: str) -> Membership | None:
        return self._members.get(peer)

    def __contains__(self, peer: str) -> bool:
        return peer in self._members

    @property
    def own(self) -> Membership:
        return self._members[self.self_id]

    def expected(self, iteration: int) -> list[str]:
        """Members whose contribution iteration ``iteration`` needs, sorted by peer id."""
        return sorted(p for p, m in self._members.items() if m.covers(iteration))

    def reset(self, from_iteration: int, peers: list[str]) -> None:
        """A re-synced part (``resync``): this node and the ``peers`` that took it back, from
        ``from_iteration``; nobody is remembered dead (they answered again)."""
        self._members = {p: Membership(from_iteration) for p in (self.self_id, *peers)}
        self.dead.clear()

    def peers(self) -> list[str]:
        """Every member but this node."""
        return sorted(p for p in self._members if p != self.self_id)
