"""Which run a node joins when ``gwtf/current-run`` holds several: the one its initial peers belong to.

In an open swarm anyone may publish a run spec; nobody can replace another's (entries are owned),
so the DHT may hold several. A node is led to a swarm by its ``--initial-peers``: the run one of
them created wins, then a run one of them serves in, then the run with the most live nodes (ties:
the lowest run id). Pure: the caller reads the runs and their members.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gwtfp2p.dht.records import RunSpecRecord


def choose_run(runs: Mapping[str, RunSpecRecord], members: Mapping[str, Collection[str]],
               initial_peer_ids: Collection[str]) -> RunSpecRecord | None:
    """``runs``: creator peer id -> its run spec record; ``members``: run id -> peer ids with a live node
    record in it (only needed when there are several runs)."""
    if not runs:
        return None
    by_creator = sorted(runs.items())
    for creator, record in by_creator:
        if creator in initial_peer_ids:
            return record
    run_ids = sorted({record.run_id for _, record in by_creator})
    first_of = {run_id: next(r for _, r in by_creator if r.run_id == run_id) for run_id in run_ids}
    if len(run_ids) == 1:
        return first_of[run_ids[0]]
    for run_id in run_ids:
        if set(members.get(run_id, ())) & set(initial_peer_ids):
            return first_of[run_id]
    return first_of[max(run_ids, key=lambda run_id: (len(members.get(run_id, ())), [-ord(c) for c in run_id]))]
