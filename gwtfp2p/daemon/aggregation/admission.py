"""Who may take part in a part's aggregation, and what of theirs it accepts: the aggregator's gatekeeper.

A peer takes part only if its signed DHT record says it serves this part (``PeerBook.serves``): its
membership notices, contributions and agreement messages are refused otherwise. A contribution is
checked before it is acknowledged (``vetting.check_contribution``, ``check_tags``) and must carry its
origin's signature over (part, iteration, count, bound, the sum's sha256, tags), so a member that
forwards another's contribution (the agreement pulls a dead member's from a survivor) cannot alter
it. Our own contributions are signed here. A sender whose contribution is invalid (no honest node
sends one) is excluded (``exclude``: the failure detector's, so the part stops waiting for it). The step's
screening is ``vetting.screen``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from gwtfp2p.daemon.aggregation.vetting import SIGNATURE_TAGS, check_contribution, check_tags, screen
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.swarm.peers import joined_signature, split_signature
from gwtfp2p.daemon.wire import CONTRIB, AggMessage
from gwtfp2p.model.aggregate import GradContribution

logger = logging.getLogger(__name__)
HASH_IN_THREAD_BYTES = 1 << 20
DOMAIN = b"gwtf-contribution-v1\0"


class Peers(Protocol):
    def serves(self, peer: str, stage: int) -> bool: ...
    def sign(self, message: bytes) -> bytes: ...
    def verify(self, peer: str, message: bytes, signature: bytes) -> bool: ...


async def grad_digest(payload: torch.Tensor) -> bytes:
    """sha256 of a contribution as it travels (the int64 sum, or its encoding; large ones in a worker thread)."""
    data = memoryview(payload.contiguous().view(torch.uint8).numpy()).cast("B")
    if len(data) <= HASH_IN_THREAD_BYTES:
        return hashlib.sha256(data).digest()
    return await asyncio.to_thread(lambda: hashlib.sha256(data).digest())


def contribution_message(stage: int, iteration: int, origin: str, count: int, bound: int, digest: bytes,
                         tags: Mapping[str, Any]) -> bytes:
    """What a contribution's origin signs: everything that makes the contribution, in canonical form."""
    own = {k: v for k, v in sorted(tags.items()) if k not in SIGNATURE_TAGS}
    head = json.dumps([stage, iteration, origin, count, bound, own], sort_keys=True, separators=(",", ":"))
    return DOMAIN + head.encode() + b"\0" + digest


class Admission:
    """The aggregation gatekeeper of one node of part ``stage`` (0: the data holders)."""

    def __init__(self, self_id: str, stage: int, peers: Peers, *, numel: int, tokens_per_microbatch: int,
                 exclude: Callable[[str, str], object] | None = None) -> None:
        self.self_id = self_id
        self.exclude = exclude
        self.stage = stage
        self.peers = peers
        self.numel = numel
        self.tokens_per_microbatch = tokens_per_microbatch

    def eligible(self, peer: str) -> bool:
        """Whether ``peer`` may aggregate with this part (its signed record serves it)."""
        return peer == self.self_id or self.peers.serves(peer, self.stage)

    async def admit(self, sender: str, message: AggMessage, payload: torch.Tensor) -> str:
        """Why an aggregation message is refused ("" if it is accepted); ``payload``: a contribution as it
        travels (the int64 sum, checked here, or a lossy codec's bytes, checked by the codec)."""
        if not self.eligible(sender):
            return f"{sender} does not serve part {self.stage}"
        if message.op != CONTRIB:
            return ""
        if not self.eligible(message.origin):
            return f"the contribution's origin {message.origin} does not serve part {self.stage}"
        tags = message.tags or {}
        reason = check_tags({k: v for k, v in tags.items() if k not in SIGNATURE_TAGS}, message.count,
                            self.tokens_per_microbatch)
        if not reason and payload.dtype == torch.int64:
            reason = check_contribution(GradContribution(message.origin, payload.reshape(-1), message.count,
                                                         message.bound), self.numel)
        if not reason:
            digest = await grad_digest(payload)
            signed = contribution_message(self.stage, message.iteration, message.origin, message.count,
                                          message.bound, digest, tags)
            if not self.peers.verify(message.origin, signed, joined_signature(tags)):
                reason = f"the contribution of {message.origin} does not carry its valid signature"
        if reason and self.exclude is not None:  # proof of misbehaviour: honest members never send one
            self.exclude(sender, f"sent an invalid contribution: {reason}")
        return reason

    async def signed_tags(self, iteration: int, own: Any, tags: Mapping[str, Any]) -> dict[str, Any]:
        """Our contribution's tags with our signature added (unchanged with signatures off); ``own`` is our
        contribution as it travels (``payload``, ``count``, ``bound``)."""
        digest = await grad_digest(own.payload)
        message = contribution_message(self.stage, iteration, self.self_id, own.count, own.bound, digest, tags)
        signature = self.peers.sign(message)
        return {**tags, **split_signature(signature)} if signature else dict(tags)


class Decoder(Protocol):
    def decode(self, contribution: Any) -> GradContribution: ...


def screen_received(codec: Decoder, used: list[Any], factor: float) -> tuple[list[Any], dict[str, str]]:
    """On the compute thread: of the agreed contributions (``rounds.Received``, as they travelled), those
    the step uses and the excluded ones with the reason (``vetting.screen`` on the decoded sums, with the
    run's ``screen_factor``)."""
    screened = screen([codec.decode(r.contribution) for r in used], factor)
    return [r for r in used if r.contribution.origin not in screened.excluded], screened.excluded


class Prober(Protocol):
    async def alive(self, peer: str) -> bool: ...


async def alive_among(prober: Prober, claimed_dead: tuple[str, ...], known_dead: set[str], self_id: str,
                      claimant: str) -> str:
    """A member's claim that peers died is evidence, not a verdict: the first of them that answers our own
    probe, logged ("" if none does: the claim holds for us too, and our probes declared them dead)."""
    for peer in claimed_dead:
        if peer != self_id and peer not in known_dead and await prober.alive(peer):
            logger.warning("%s claims %s is dead, but it answers our probe: claim ignored", claimant, peer)
            return peer
    return ""


def report_excluded(events: Events, stage: int, iteration: int, excluded: Mapping[str, str]) -> None:
    """Log and announce (event ``excluded_contribution``) every contribution the screen excluded."""
    for peer, reason in sorted(excluded.items()):
        logger.warning("stage %d iteration %d: contribution of %s excluded: %s", stage, iteration, peer, reason)
        events.emit("excluded_contribution", stage=stage, iteration=iteration, peer=peer, reason=reason)


async def signed_tags(admission: Admission | None, iteration: int, own: Any, tags: Mapping[str, Any]) -> dict[str, Any]:
    """Our contribution's tags, signed by ``admission`` (as they are without one)."""
    return dict(tags) if admission is None else await admission.signed_tags(iteration, own, tags)


class Codec(Protocol):
    def refusal(self, codec: str, payload: torch.Tensor) -> str: ...


async def refusal_of(admission: Admission | None, codec: Codec, sender: str, message: AggMessage,
                     payload: torch.Tensor) -> str:
    """Why the aggregator refuses ``message`` ("" if it takes it): the codec's checks, then ``admit``; logged."""
    refusal = codec.refusal(message.codec, payload) if message.op == CONTRIB else ""
    if not refusal and admission is not None:
        refusal = await admission.admit(sender, message, payload)
    if refusal:
        logger.warning("stage %s: %s from %s refused: %s", getattr(admission, "stage", "?"), message.op, sender,
                       refusal)
    return refusal


def silent_for(rnd: Any, peer: str, now: float) -> float:
    """Seconds a round (``rounds.Round``; None: none) has waited for ``peer``'s contribution (0: not waiting)."""
    waiting = rnd is not None and rnd.own is not None and peer in rnd.agreement.waiting_for
    return now - rnd.begun if waiting else 0.0
