"""Which state a joiner may load: the one whose hash a majority of the stage's signed records announce.

A replica serving its state could serve anything (a noised state under a high claimed iteration). Every
replica's DHT record, signed by it, announces the hashes of its last steps (``recent_hashes``, or its
``weight_hash`` after the step before its iteration). A downloaded state of iteration ``i`` (``i`` steps
taken) is loaded only with the hash that more than half of the stage's online replicas announce for
step ``i - 1`` (``majority_hash``; the joiner itself not counted), and the model checks the bytes hash
to it before it touches the part. Records lag the state by a heartbeat or two: ``agreed_hash`` reads the
view again until a majority shows or cannot show any more. A record claiming an iteration far past
the data holders' (``plausible_ceiling``) is no voter: a replica cannot have stepped iterations the data
holders never started, and one such claim must not veto every join into a stage with one honest replica.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Protocol

from gwtfp2p.dht import NodeRecord
from gwtfp2p.dht.records import HASH_ANCHOR_STRIDE, HASH_HISTORY_STEPS, RECENT_STEPS

logger = logging.getLogger(__name__)


def announced(record: NodeRecord) -> dict[int, str]:
    """Step iteration -> state hash after it, as a record announces them."""
    hashes = dict(record.recent_hashes)
    if record.weight_hash and record.iteration >= 1:
        hashes.setdefault(record.iteration - 1, record.weight_hash)
    return hashes


def anchor_after(iteration: int) -> int:
    """The first iteration at or after ``iteration`` whose last step is a multiple of ``HASH_ANCHOR_STRIDE``:
    records keep the hashes of those steps longest (``pick_recent_hashes``), so a majority shows for them."""
    return iteration + (1 - iteration) % HASH_ANCHOR_STRIDE


def may_still_announce(record: NodeRecord, step: int) -> bool:
    """Whether ``record``'s node, silent on ``step`` now, can announce it in a later record: it has not
    taken the step yet, or the step is still among its last ``RECENT_STEPS`` (an anchor step: within
    ``HASH_HISTORY_STEPS``). Records only move on, so once past that it never will."""
    past = record.iteration - 1 - step
    return past < (HASH_HISTORY_STEPS if step % HASH_ANCHOR_STRIDE == 0 else RECENT_STEPS)


def plausible_ceiling(holders: Iterable[NodeRecord]) -> int | None:
    """The highest iteration a replica's record may claim: the data holders' (the lower median of the
    online ones, so one lying holder cannot raise it) plus ``HASH_HISTORY_STEPS`` of slack for records
    published at different moments. None without a data holder in the view (no limit)."""
    iterations = [r.iteration for r in holders if r.role == "data" and r.state == "online"]
    return statistics.median_low(iterations) + HASH_HISTORY_STEPS if iterations else None


def majority_hash(records: Iterable[NodeRecord], iteration: int, seen: dict[str, str] | None = None,
                  ceiling: int | None = None) -> tuple[str | None, bool, str]:
    """(the hash a majority announces after step ``iteration - 1``, whether one can still emerge, why not).

    ``records``: the stage's online replicas but the joiner; those past ``ceiling`` do not count. A hash
    needs more than half of the others. ``seen``: peer id -> the hash an earlier record of it announced for
    that step (updated here).
    """
    if ceiling is not None and iteration > ceiling:
        return None, False, f"iteration {iteration} is past the data holders' iteration + {HASH_HISTORY_STEPS}"
    records, implausible = list(records), []
    if ceiling is not None:
        implausible = [r for r in records if r.iteration > ceiling]
        records = [r for r in records if r.iteration <= ceiling]
    ignored = (f" (not counted: {', '.join(f'{r.peer_id} at iteration {r.iteration}' for r in implausible)}, "
               f"past the data holders' iteration + {HASH_HISTORY_STEPS})") if implausible else ""
    if not records:
        return None, False, "no online replica announces a state" + ignored
    seen = {} if seen is None else seen
    for record in records:
        if digest := announced(record).get(iteration - 1):
            seen[record.peer_id] = digest
    votes = Counter(seen[r.peer_id] for r in records if r.peer_id in seen)
    silent = len(records) - sum(votes.values())
    needed = len(records) // 2 + 1
    if votes and votes.most_common(1)[0][1] >= needed:
        return votes.most_common(1)[0][0], False, ""
    may_vote = sum(1 for r in records if r.peer_id not in seen and may_still_announce(r, iteration - 1))
    possible = max(votes.values(), default=0) + may_vote >= needed
    why = (f"{dict(votes) or 'no hash'} announced for step {iteration - 1} by {len(records) - silent} of "
           f"{len(records)} replicas; {needed} must agree{ignored}")
    return None, possible, why


class StageView(Protocol):
    async def refresh(self) -> object: ...
    def by_stage(self, stage: int) -> list[NodeRecord]: ...


async def agreed_hash(view: StageView, stage: int, iteration: int, *, wait_s: float, poll_s: float) -> str | None:
    """The majority's hash for a state of ``iteration`` steps of ``stage`` (reading the view again for at
    most ``wait_s`` while one may still emerge); None (logged) if none does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    seen: dict[str, str] = {}
    while True:
        online = [r for r in view.by_stage(stage) if r.state == "online"]
        digest, possible, why = majority_hash(online, iteration, seen, plausible_ceiling(view.by_stage(0)))
        if digest is not None:
            return digest
        if not possible or loop.time() >= deadline:
            logger.log(logging.WARNING if wait_s > 0 else logging.INFO,
                       "stage %d: no majority of replicas vouches for a state of iteration %d: %s", stage,
                       iteration, why)
            return None
        await asyncio.sleep(poll_s)
        await view.refresh()
