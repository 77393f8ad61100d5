"""Which contributions one iteration's aggregation uses: the same set on every surviving member.

Pure (no I/O, no clock): inputs are what arrived and who died, outputs are messages to send and,
at the end, the decision (sorted peer ids). The rule is the *union of what the survivors hold*:

* Fast path (no crash, no membership change): a member holding the contribution of every member
  it expects, each of which pushed it with exactly the same expected list, decides all of them at
  once; no extra message.
* Otherwise the lowest-id live member leads. It queries every other live member with its dead
  set; each merges that set (so a late decision from a member the leader saw die is ignored from
  then on) and answers with the ids it holds and the decision it applied, if any. With answers to
  the current query from every live member, the leader adopts an applied decision if one exists,
  else takes the union of the held ids; pulls what it lacks from a holder; decides; and tells
  every live member, who pull what they lack from it and apply. Any new death makes the leader
  query again (a new epoch); a member that joins meanwhile is asked in the current one; a dead
  leader is replaced by the next lowest id.
* A member ignores decisions from peers it believes dead; decisions are only sent by members that
  applied them. With crashes detected (a dead peer's RPCs fail at once) survivors decide alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gwtfp2p.daemon.wire import DECIDED, QUERY, REPORT, WANT

UNSOLICITED = -1  # epoch of a report sent on a member's own initiative (wakes the leader up)


@dataclass(frozen=True)
class Send:
    """A message for the aggregator to send: ``ids`` is the dead set (query), the held ids (report),
    the decision (decided) or the wanted contributions (want)."""

    op: str
    peer: str
    ids: tuple[str, ...]
    epoch: int = 0
    decided: bool = False


@dataclass(frozen=True)
class Report:
    held: frozenset[str]
    epoch: int


@dataclass
class RoundAgreement:
    """The agreement of one member (``me``) on one iteration."""

    me: str
    expected: set[str] = field(default_factory=set)
    views: dict[str, frozenset[str]] = field(default_factory=dict)  # each pusher's expected list
    held: set[str] = field(default_factory=set)
    dead: set[str] = field(default_factory=set)
    started: bool = False  # our own contribution is in
    decision: tuple[str, ...] | None = None
    how: str = ""  # fast | leader | adopted
    epoch: int = 0  # our current query epoch (as leader)
    queried_epoch: int = -1
    queried: set[str] = field(default_factory=set)  # members sent the query of ``queried_epoch``
    reports: dict[str, Report] = field(default_factory=dict)
    queries: dict[str, int] = field(default_factory=dict)  # querier -> latest epoch to answer
    answered: dict[str, int] = field(default_factory=dict)  # querier -> epoch answered
    told: set[str] = field(default_factory=set)  # peers sent our decision
    tell: set[str] = field(default_factory=set)  # peers to send our decision once we have one
    adoption: tuple[tuple[str, ...], str] | None = None  # (decision, from whom) waiting for data
    announced: dict[str, tuple[str, ...]] = field(default_factory=dict)  # who told us it applied what
    wanted: dict[str, str] = field(default_factory=dict)  # contribution id -> peer asked for it
    woken: str = ""  # the leader our unsolicited report went to
    conflicts: list[str] = field(default_factory=list)
    unconfirmed: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)  # querier -> (epoch, dead)

    # -- inputs ---------------------------------------------------------------------------------
    def expect(self, peers: Iterable[str]) -> None:
        """Members to expect (learned from pushes and views); frozen once decided."""
        if self.decision is None:
            self.expected.update(peers)
            if self.started:
                self.views[self.me] = frozenset(self.expected)

    def start(self, expected: Iterable[str]) -> None:
        """Our own contribution is ready; ``expected`` are the members we expect (us included)."""
        self.started = True
        self.held.add(self.me)
        self.expect([self.me, *expected])

    def contribution(self, origin: str, view: Iterable[str] | None = None) -> None:
        """We now hold ``origin``'s contribution; ``view`` is its expected list if it pushed it itself."""
        self.held.add(origin)
        if view is not None:
            self.update_view(origin, view)

    def update_view(self, peer: str, view: Iterable[str]) -> None:
        """``peer``'s expected list; one that changes after we decided gets our decision (it may wait for a
        member that joined its list late and will never push: the others decided without it)."""
        if peer in self.dead:
            return
        new = frozenset(view) | {peer}
        if self.decision is not None and peer != self.me and self.views.get(peer) != new:
            self.tell.add(peer)
        self.views[peer] = new
        self.expect(new)

    def peer_dead(self, peer: str) -> bool:
        """Record a death; True if it is news. A leader that already queried queries again."""
        if peer == self.me or peer in self.dead:
            return False
        self.dead.add(peer)
        if self.queried_epoch == self.epoch:
            self.epoch += 1
        return True

    def query(self, sender: str, epoch: int, dead: Iterable[str]) -> None:
        """The leader ``sender`` asks what we hold; we adopt its dead set first."""
        if sender in self.dead:
            return
        for peer in dead:
            self.peer_dead(peer)
        self.queries[sender] = max(epoch, self.queries.get(sender, -1))

    def unconfirmed_query(self, sender: str, epoch: int, dead: Iterable[str]) -> None:
        """A query whose death claims our own evidence does not confirm: taken once ``sender`` leads us,
        its dead set for this round only (a leader decides the round anyway; unanswered, it would find
        us silent); from a peer that does not lead, never."""
        known = self.unconfirmed.get(sender)
        if known is None or epoch > known[0]:
            self.unconfirmed[sender] = (epoch, tuple(dead))

    def report(self, sender: str, held: Iterable[str], epoch: int) -> None:
        """``sender`` holds ``held``; it gets our decision once we have one (again if it still reports:
        it has not applied the one we sent)."""
        if sender in self.dead:
            return
        known = self.reports.get(sender)
        if known is None or epoch >= known.epoch:
            self.reports[sender] = Report(frozenset(held), epoch)
        self.tell.add(sender)
        self.told.discard(sender)

    def decided(self, sender: str, ids: Iterable[str]) -> None:
        """``sender`` applied ``ids``: we apply it too once we hold its contributions."""
        if sender in self.dead:
            return
        decision = tuple(sorted(ids))
        if self.decision is not None:
            if decision != self.decision:
                self.conflicts.append(f"{sender} applied {decision}, we applied {self.decision}")
            return
        self.announced[sender] = decision
        if self.adoption is None:
            self.adoption = (decision, sender)

    def late_push(self, peer: str) -> None:
        """``peer`` pushed its contribution after we decided: it gets our decision."""
        self.tell.add(peer)

    # -- state ----------------------------------------------------------------------------------
    @property
    def live(self) -> list[str]:
        return sorted(self.expected - self.dead)

    @property
    def leader(self) -> str:
        live = self.live
        return live[0] if live else self.me

    @property
    def waiting_for(self) -> list[str]:
        """Live members whose contribution we lack."""
        return [p for p in self.live if p not in self.held]

    def waiting_on(self) -> list[str]:
        """Peers whose answer, contribution or data this member waits for (to watch for crashes)."""
        if self.decision is not None:
            return []
        peers = set(self.waiting_for) | {p for p in self.wanted.values() if p not in self.dead}
        if self.adoption is not None:
            peers.add(self.adoption[1])
        if self.leader != self.me:
            peers.add(self.leader)
        elif self.queried_epoch == self.epoch:
            peers |= {p for p in self.live if p != self.me and self._answer(p) is None}
        return sorted(peers - {self.me})

    def _answer(self, peer: str) -> Report | None:
        report = self.reports.get(peer)
        return report if report is not None and report.epoch == self.epoch else None

    # -- progress -------------------------------------------------------------------------------
    def progress(self) -> list[Send]:
        """Messages to send now; sets ``decision`` when this member can apply one."""
        out: list[Send] = []
        if self.decision is None and (pending := self.unconfirmed.pop(self.leader, None)) is not None:
            self.query(self.leader, *pending)
        if self.decision is None and self.started:
            self._advance(out)
        if self.decision is not None:
            for peer in sorted((self.tell | set(self.queries)) - self.told - self.dead - {self.me}):
                out.append(Send(DECIDED, peer, self.decision))
                self.told.add(peer)
        elif self.started:
            for peer, epoch in sorted(self.queries.items()):
                if peer not in self.dead and self.answered.get(peer, -2) < epoch:
                    self.answered[peer] = epoch
                    out.append(Send(REPORT, peer, tuple(sorted(self.held)), epoch))
        return out

    def _advance(self, out: list[Send]) -> None:
        if self.adoption is not None and self._adopt(out):
            return
        everyone = frozenset(self.expected)
        if everyone <= self.held and all(self.views.get(p) == everyone for p in everyone):
            self._decide(everyone, "fast")
        elif self.waiting_for:
            return
        elif self.leader != self.me:
            if self.woken != self.leader:
                self.woken = self.leader
                out.append(Send(REPORT, self.leader, tuple(sorted(self.held)), UNSOLICITED))
        else:
            self._lead(out)

    def _adopt(self, out: list[Send]) -> bool:
        """Apply a decision we were told once we hold its contributions; False if it became void."""
        assert self.adoption is not None
        ids, source = self.adoption
        missing = [p for p in ids if p not in self.held]
        if not missing:
            self._decide(ids, "adopted")
            return True
        if source in self.dead:  # another live member that applied it has its data; if none, nobody does
            source = next((p for p, d in sorted(self.announced.items()) if d == ids and p not in self.dead), "")
            if not source:
                self.adoption = None  # no survivor can have applied it without holding its data
                return False
            self.adoption = (ids, source)
        self._want(missing, {p: source for p in missing}, out)
        return True

    def _lead(self, out: list[Send]) -> None:
        others = [p for p in self.live if p != self.me]
        if self.queried_epoch != self.epoch:
            self.queried_epoch, self.queried = self.epoch, set()
        fresh = [p for p in others if p not in self.queried]  # a member that joined since is asked too
        dead = tuple(sorted(self.dead))
        out.extend(Send(QUERY, p, dead, self.epoch) for p in fresh)
        self.queried.update(fresh)
        answers = [self._answer(p) for p in others]
        if any(r is None for r in answers):
            return
        candidate = set(self.held).union(*(r.held for r in answers if r is not None))
        missing = sorted(candidate - self.held)
        if missing:
            holders = {p: next((q for q in others if p in self.reports[q].held), "") for p in missing}
            self._want(missing, holders, out)
            return
        self._decide(candidate, "leader")
        self.tell.update(others)

    def _want(self, missing: list[str], holders: dict[str, str], out: list[Send]) -> None:
        by_peer: dict[str, list[str]] = {}
        for p in missing:
            asked = self.wanted.get(p)
            if asked is not None and asked not in self.dead:
                continue
            holder = holders.get(p, "")
            if holder and holder not in self.dead:
                self.wanted[p] = holder
                by_peer.setdefault(holder, []).append(p)
        out.extend(Send(WANT, peer, tuple(ids)) for peer, ids in sorted(by_peer.items()))

    def _decide(self, ids: Iterable[str], how: str) -> None:
        self.decision = tuple(sorted(ids))
        self.how = how
        self.adoption = None
