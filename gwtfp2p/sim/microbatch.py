"""A microbatch in flight: who holds each position of its path and how far each position got.

Positions run 0..S+1: 0 is the data holder's head (it keeps the embedded input for stage 1 until
stage 1's gradient comes back), 1..S the relays, S+1 the data holder's tail (loss). ``attempt``
grows whenever a position is handed to another node, so messages and tasks meant for an older
holder are recognized as stale. Owns the record only; the data plane moves it along.
"""

from __future__ import annotations

NONE, IN_FWD, QUEUED_FWD, FWD_DONE, IN_BWD, QUEUED_BWD, BWD_DONE = range(7)
STATE_NAMES = ("none", "in-forward", "queued-forward", "forward-done", "in-backward", "queued-backward",
               "backward-done")


class Microbatch:
    __slots__ = (
        "attempt",
        "bwd_depart",
        "checkpointed",
        "dh",
        "dispatched_s",
        "done",
        "fwd_depart",
        "grad_waiting",
        "holder",
        "iteration",
        "last",
        "mb_id",
        "path",
        "recomputed",
        "state",
        "tag",
        "unit",
    )

    def __init__(self, mb_id: str, dh: str, iteration: int, n_stages: int) -> None:
        n = n_stages + 2
        self.mb_id = mb_id
        self.dh = dh
        self.iteration = iteration
        self.holder: list[str | None] = [None] * n
        self.holder[0] = self.holder[-1] = dh
        self.last = n - 1  # the data holder's tail
        self.state = [NONE] * n
        self.attempt = [0] * n
        self.tag: list[object] = [None] * n  # the router's label of the hop into each position
        self.fwd_depart = [0.0] * n  # when the input to a position left its sender
        self.bwd_depart = [0.0] * n  # when the gradient to a position left its sender
        self.grad_waiting = [False] * n  # the gradient arrived while the forward was being recomputed
        self.checkpointed = [False] * n  # the holder kept only the input (no memory slot was free)
        self.dispatched_s = 0.0
        self.unit: object = None  # the router's flow unit this microbatch occupies at its data holder
        self.done = False
        self.recomputed = 0  # hops recomputed by recovery
        self.path: list[str] = []  # first forward holders, for the routing-cost metric
