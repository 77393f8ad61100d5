"""Messages of the decentralized flow protocol (all immutable; every one names its sender).

Costs are seconds (or the instance's cost unit). Edge ids name one unit on one edge
(upstream → downstream); ``epoch`` grows each time a unit's edge changes owner, so a stale
notice never undoes a newer one. The wire codec (wire.py) turns these into plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Advert:
    """Cost to reach each sink from the sender along a path with spare capacity (inf: none)."""

    sender: str
    costs: tuple[tuple[str, float], ...]
    spare: int


@dataclass(frozen=True)
class Request:
    """Upstream asks the receiver to carry ``len(edge_ids)`` new units towards ``sink``."""

    sender: str
    sink: str
    edge_ids: tuple[str, ...]
    up_costs: tuple[float, ...]
    expected_cost: float


@dataclass(frozen=True)
class Accept:
    sender: str
    edge_ids: tuple[str, ...]


@dataclass(frozen=True)
class Reject:
    """Refused units, with the receiver's fresh advertisement."""

    sender: str
    edge_ids: tuple[str, ...]
    advert: Advert


@dataclass(frozen=True)
class ForwardEntry:
    """A unit the sender owns on the edge sender → receiver."""

    edge_id: str
    sink: str
    up_cost: float
    epoch: int


@dataclass(frozen=True)
class BackwardEntry:
    """A unit the sender holds on the edge receiver → sender, with its remaining cost to the sink."""

    edge_id: str
    remaining_cost: float
    complete: bool
    epoch: int


@dataclass(frozen=True)
class Refresh:
    """Soft-state refresh between neighbours; also serves as the switch notice after a move."""

    sender: str
    forward: tuple[ForwardEntry, ...] = ()
    backward: tuple[BackwardEntry, ...] = ()


@dataclass(frozen=True)
class Cancel:
    """Upstream dropped these units: the receiver drops them too and cascades downstream."""

    sender: str
    edge_ids: tuple[str, ...]


@dataclass(frozen=True)
class PushBack:
    """Downstream dropped these units: the receiver must route them again."""

    sender: str
    edge_ids: tuple[str, ...]


@dataclass(frozen=True)
class MovedEntry:
    """The unit on ``edge_id`` is now held by ``holder`` (a forwarding address after a move)."""

    edge_id: str
    holder: str
    epoch: int


@dataclass(frozen=True)
class Moved:
    sender: str
    entries: tuple[MovedEntry, ...]


@dataclass(frozen=True)
class TableUnit:
    """One matched unit in a flow table: prev --in_id--> sender --out_id--> next."""

    in_id: str
    prev: str
    out_id: str
    next: str
    sink: str
    in_cost: float
    out_cost: float
    up_cost: float
    down_cost: float


@dataclass(frozen=True)
class FlowTable:
    """A node's matched units, its spare capacity and its edge costs, for same-stage peers;
    ``load`` and ``uplink_s_per_unit`` price what one unit less saves on its uplink."""

    sender: str
    spare: int
    units: tuple[TableUnit, ...]
    costs: tuple[tuple[str, float], ...]
    load: int = 0
    uplink_s_per_unit: float = 0.0


@dataclass(frozen=True)
class UnitTransfer:
    """Everything needed to install one edge unit handed over by a peer."""

    edge_id: str
    peer: str
    sink: str
    epoch: int
    cost: float
    complete: bool = True


@dataclass(frozen=True)
class ProposeTakeover:
    """The sender offers to carry the receiver's unit prev → receiver → next as prev → sender → next."""

    sender: str
    proposal_id: str
    in_id: str
    out_id: str
    my_in_cost: float
    my_out_cost: float
    expected_gain: float
    my_marginal_s: float = 0.0  # the wait one more unit adds on the sender's uplink


@dataclass(frozen=True)
class ProposeSwap:
    """Exchange the next hops of the sender's unit (mine) and the receiver's unit (theirs).
    ``my_new_out_cost`` is the sender's edge to the receiver's unit's next hop, where the sender's unit
    goes; the receiver re-checks the gain with it and its own edge to ``mine_next``."""

    sender: str
    proposal_id: str
    sink: str
    mine_in: str
    mine_out: str
    mine_next: str
    theirs_in: str
    theirs_out: str
    my_up_cost: float
    my_old_out_cost: float
    my_new_out_cost: float
    my_remaining: float
    expected_gain: float


@dataclass(frozen=True)
class MoveAnswer:
    """Answer to a proposal; an acceptance hands over the receiver's edge units."""

    sender: str
    proposal_id: str
    accepted: bool
    incoming: UnitTransfer | None = None
    outgoing: UnitTransfer | None = None


@dataclass(frozen=True)
class SwapCommit:
    """Second half of a swap or exchange: the proposer hands over its unit's edge units."""

    sender: str
    proposal_id: str
    outgoing: UnitTransfer
    incoming: UnitTransfer | None = None


@dataclass(frozen=True)
class ProposeExchange:
    """Exchange whole units: the receiver's unit moves to the sender and the sender's (``mine``)
    to the receiver; each side keeps its load. ``my_in_cost``/``my_out_cost`` are the sender's
    edges to the receiver's unit's prev and next; ``mine`` carries the sender's own costs."""

    sender: str
    proposal_id: str
    in_id: str
    out_id: str
    my_in_cost: float
    my_out_cost: float
    mine: TableUnit
    expected_gain: float


@dataclass(frozen=True)
class Residual:
    """The sender's residual distances in hops per sink (residual.py): ``ins`` for the previous
    stage, from a unit arriving at the sender; ``outs`` for the next stage, from a unit leaving it;
    ``blocked``: holders waiting for an augmenting step (holder, its tick when it last said so, the
    sender's hops to it); ``xins`` /
    ``xouts``: the labels a walk follows, which may also displace another holder's unit; ``wants``:
    holders that want more units and have no path with spare capacity (holder, its tick when it last
    said so, the sender's hops to it, the units it routes), for fairness between holders (fairness.py);
    ``paths``: (label kind, sink, the vertices its way visits), so that no node takes a way that passes
    through itself."""

    sender: str
    ins: tuple[tuple[str, int], ...]
    outs: tuple[tuple[str, int], ...]
    blocked: tuple[tuple[str, int, int], ...] = ()
    xins: tuple[tuple[str, int], ...] = ()
    xouts: tuple[tuple[str, int], ...] = ()
    wants: tuple[tuple[str, int, int, int], ...] = ()
    paths: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Augment:
    """A walk along a holder's residual labels (augment.py). ``edge_id`` empty: a new unit would enter
    the receiver from the sender; else the receiver's unit on that edge should leave the sender."""

    sender: str
    sink: str
    budget: int
    edge_id: str
    pure: bool = False  # follow the pure labels: a displaced holder's own re-route, which displaces no other


Message = (Advert | Request | Accept | Reject | Refresh | Cancel | PushBack | Moved | FlowTable
           | ProposeTakeover | ProposeSwap | ProposeExchange | MoveAnswer | SwapCommit | Residual | Augment)


@dataclass(frozen=True)
class Envelope:
    """A message addressed to ``dst``."""

    dst: str
    message: Message
