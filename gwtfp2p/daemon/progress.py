"""What a node says about its own training, kept in one place: its state, the swarm's loss and speed.

``NodeProgress`` is written by the components that learn each figure (the lifecycle: the state; the
data holders' ``Closed`` or a data holder's own iteration: loss and tokens/s) and read by whoever
reports (the DHT record, ``progress`` events, the stage watch). Plain data, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

STATES = ("joining", "online", "leaving")


@dataclass
class NodeProgress:
    state: str = "joining"  # joining | online | leaving
    loss: float | None = None  # the swarm's mean loss of the last closed iteration
    tokens_per_s: float = 0.0  # the swarm's tokens per second in that iteration
    prior_compute_s: float = 0.0  # forward + backward seconds per microbatch, estimated before measuring
    started_at: float = 0.0  # wall clock when the node started (events report times from it)
    ready_at: float = 0.0  # wall clock when it was ready to serve (0: not yet)
