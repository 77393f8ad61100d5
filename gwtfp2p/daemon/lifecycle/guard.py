"""Who may send this node what, and whether it is well-formed: every message is checked before it is routed.

The inbox asks the ``Guard`` first. Senders are named by libp2p (authenticated); their role and stage
come from their signed DHT records (``swarm.peers.PeerBook``). A forward must come from a node of the
previous stage (the tail's from the last stage), name a live data holder's microbatch of an iteration
no further than ``FUTURE_ITERATIONS`` ahead, and carry a finite float tensor of the run's activation
shape; a backward must come from the hop our forward went to (or, after a recovery re-pointed it, another
replica of the next stage), shaped like what we sent. Malformed
tensors raise the transport's ``ProtocolError`` (the sender gets a typed ``bad_request``); refusals
of entitlement are ``Ack``s with the reason. ``Closed`` is taken only from data holders and for this
iteration or the next; ``Member`` only from peers whose record serves our part; messages that claim
a peer died (an agreement ``query``, a recovery ``Lost``) only once our own probe agrees, or (a query)
once our own round has waited on that peer for ``silent_after_s`` too (a member that answers pings and
never contributes is silent for everyone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from gwtfp2p.daemon.wire import QUERY, Closed, Lost, Member
from gwtfp2p.transport import Ack, ProtocolError, TransferMeta

logger = logging.getLogger(__name__)
FUTURE_ITERATIONS = 2  # a relay takes forwards of at most this many iterations past its own


class Peers(Protocol):
    def get(self, peer: str) -> Any: ...
    def serves(self, peer: str, stage: int) -> bool: ...


class Kept(Protocol):
    def get(self, key: str) -> Any: ...


class Prober(Protocol):
    async def alive(self, peer: str) -> bool: ...


class Freshness(Protocol):
    """The DHT view: read again soon (``poke``); ``rounds`` counts the reads done."""

    rounds: int

    def poke(self) -> None: ...


@dataclass(frozen=True)
class Shape:
    """What the run's activations look like: ``[microbatch_size, seq_len, hidden]`` of ``dtype``."""

    microbatch_size: int
    seq_len: int
    hidden: int
    dtype: torch.dtype
    microbatches_per_dh: int

    @property
    def dims(self) -> tuple[int, int, int]:
        return self.microbatch_size, self.seq_len, self.hidden


def tensor_problem(tensor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> str:
    """Why ``tensor`` is not a finite ``dtype`` tensor of ``shape`` ("" if it is)."""
    if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
        return f"expected {str(dtype).removeprefix('torch.')} {list(shape)}, got " \
               f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"
    if not bool(torch.isfinite(tensor).all()):
        return "the tensor holds NaN or infinite values"
    return ""


class Guard:
    """The checks of one node of ``stage`` (0: a data holder) of an ``n_stages`` pipeline."""

    def __init__(self, self_id: str, stage: int, n_stages: int, shape: Shape, *, peers: Peers, kept: Kept,
                 prober: Prober, view: Freshness, iteration: Callable[[], int], refresh_s: float,
                 silent_after_s: float = 30.0) -> None:
        self.self_id = self_id
        self.stage = stage
        self.n_stages = n_stages
        self.shape = shape
        self.peers = peers
        self.kept = kept  # our outputs still waiting for their gradient (the outbox)
        self.prober = prober
        self.view = view
        self.iteration = iteration  # this part's iteration (steps taken)
        self.refresh_s = refresh_s  # how long a message from an unknown peer waits for the view to be read
        self.silent_after_s = silent_after_s
        self.refused = 0

    def _refuse(self, sender: str, what: str, reason: str) -> Ack:
        self.refused += 1
        logger.warning("refused %s from %s: %s", what, sender, reason)
        return Ack(accepted=False, reason=reason[:200])

    def _malformed(self, sender: str, what: str, reason: str) -> ProtocolError:
        self.refused += 1
        logger.warning("malformed %s from %s: %s", what, sender, reason)
        return ProtocolError(f"{what}: {reason}", sender)

    # -- the data path ------------------------------------------------------------------------------
    def forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None:
        """None if the forward may go on to the data path; a refusal, or ``ProtocolError`` if malformed."""
        mb, what = meta.microbatch, f"forward of {meta.microbatch.key}"
        previous = self.n_stages if meta.stage == 0 else meta.stage - 1
        if meta.stage != self.stage:
            return self._refuse(sender, what, f"this node serves stage {self.stage}, not {meta.stage}")
        if problem := tensor_problem(tensor, self.shape.dims, self.shape.dtype):
            raise self._malformed(sender, what, problem)
        holder_ok = mb.data_holder == self.self_id if self.stage == 0 else self.peers.serves(mb.data_holder, 0)
        if not holder_ok or mb.index >= self.shape.microbatches_per_dh:
            raise self._malformed(sender, what, "not a microbatch of a data holder of this run")
        if not self.peers.serves(sender, previous):
            self.view.poke()
            return self._refuse(sender, what, f"the sender does not serve stage {previous} (by its record)")
        if self.stage and mb.iteration > self.iteration() + FUTURE_ITERATIONS:
            return self._refuse(sender, what, f"iteration {mb.iteration} is too far ahead of ours "
                                              f"({self.iteration()})")
        return None

    def backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None:
        """None if the gradient may go on: it comes from the hop that took our output, shaped like it."""
        key, what = meta.microbatch.key, f"backward of {meta.microbatch.key}"
        kept = self.kept.get(key)
        next_stage = 0 if self.stage == self.n_stages else self.stage + 1
        if kept is None:  # nothing waits for it: a duplicate or unknown, which the data path answers
            if not self.peers.serves(sender, next_stage):
                return self._refuse(sender, what, "its sender serves no stage after ours")
            return None
        if (kept.hop is None or kept.hop.peer != sender) and not self.peers.serves(sender, next_stage):
            return self._refuse(sender, what, "it comes neither from the hop our forward went to nor from a "
                                              "replica of the next stage")
        if problem := tensor_problem(tensor, tuple(kept.output.shape), kept.output.dtype):
            raise self._malformed(sender, what, problem)
        return None

    # -- control --------------------------------------------------------------------------------------
    def closed(self, sender: str, closed: Closed) -> bool:
        """Whether to take a data holder's ``Closed``: from a data holder, for this iteration or the next."""
        if not self.peers.serves(sender, 0):
            self._refuse(sender, "Closed", "only the run's data holders close iterations")
            return False
        if closed.iteration > self.iteration() + 1:
            self._refuse(sender, "Closed", f"iteration {closed.iteration} is not ours ({self.iteration()})")
            return False
        return True

    async def member(self, sender: str, member: Member) -> bool:
        """Whether a membership notice may be taken: the sender's record serves our part (read the view
        again once if we do not know the sender yet: it may have just joined)."""
        if member.stage == self.stage and not self.peers.serves(sender, self.stage):
            await self.fresh_view()
        if member.stage != self.stage or not self.peers.serves(sender, self.stage):
            self._refuse(sender, "Member", f"its record does not serve part {self.stage}")
            return False
        return True

    def knows(self, sender: str) -> bool:
        """Whether ``sender`` has a record in the run (flow messages from strangers are dropped)."""
        if self.peers.get(sender) is None:
            self.view.poke()
            return False
        return True

    async def fresh_view(self) -> None:
        """Until the view was read again (at most ``refresh_s``)."""
        rounds = self.view.rounds
        self.view.poke()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.refresh_s
        while self.view.rounds == rounds and loop.time() < deadline:
            await asyncio.sleep(0.05)

    # -- claims that a peer died ----------------------------------------------------------------------
    async def claims_hold(self, sender: str, claimed_dead: Iterable[str], what: str,
                          silent_s: Callable[[str], float] = lambda _peer: 0.0) -> bool:
        """A peer's claim that others died is evidence: it holds for a peer we too have waited on for
        ``silent_after_s`` (``silent_s``), or that does not answer our own probe (which declares it dead)."""
        for peer in claimed_dead:
            if peer == self.self_id or silent_s(peer) >= self.silent_after_s:
                continue
            if await self.prober.alive(peer):
                self._refuse(sender, what, f"it claims {peer} is dead, but {peer} answers our probe")
                return False
        return True

    @staticmethod
    def claimed_dead(meta: TransferMeta | None, message: Any = None) -> tuple[str, ...] | None:
        """The peers a message claims dead (an agreement ``query``'s ids, a ``Lost``'s lost hop), or None."""
        if meta is not None and meta.tags.get("op") == QUERY:
            return tuple(meta.path)
        if isinstance(message, Lost):
            return (message.lost,)
        return None
