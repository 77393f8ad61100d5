"""In-process reference harness: the whole iteration protocol with no network.

Owns a swarm in one process - data holders (``DataHolderExecutor``) and, per stage, replicas
(``StageExecutor``) - and runs iterations: every microbatch goes head -> one replica per stage ->
tail -> back along the same path, the hops of different microbatches interleaved in a seeded random
order; optional resends make a stage hop run again on another replica (the recovery path). At the
end it runs the step protocol: each part's replicas (stage k; the data holders for head+tail)
reduce their contributions (seeded arrival order), each computes the part's squared gradient norm,
the parts' norms are exchanged (``clip_mode="global"``) and every replica steps with the total.
The daemon's parity tests compare against it. No threads, no sockets, no wall clock.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.model.gradnorm import global_sq_norm
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.model.losssum import LossSum
from gwtfp2p.model.replica import build_parts
from gwtfp2p.model.trainable import StepResult, Trainable


def microbatch_id(data_holder: int, iteration: int, index: int) -> str:
    """The id of a data holder's microbatch: unique per (data holder, iteration, index)."""
    return f"d{data_holder}/t{iteration}/m{index}"


def random_routes(mb_ids: Sequence[str], replicas: Sequence[int], seed: int) -> dict[str, tuple[int, ...]]:
    """A seeded random path (one replica index per stage) for every microbatch id."""
    rng = random.Random(seed)
    return {mb: tuple(rng.randrange(n) for n in replicas) for mb in mb_ids}


@dataclass
class IterationResult:
    """Losses per microbatch id, the step protocol's figures, and whether recomputed hops matched.

    ``part_sq_norms[p]`` holds what each replica of part ``p`` (0: the data holders, k: stage k)
    computed as the part's squared gradient norm; ``total_sq_norm`` is the global one (None in
    ``clip_mode="per_part"``).
    """

    losses: dict[str, float]
    stage_steps: list[list[StepResult]]
    data_holder_steps: list[StepResult]
    recompute_bitwise_equal: list[bool] = field(default_factory=list)
    part_sq_norms: list[list[float]] = field(default_factory=list)
    total_sq_norm: float | None = None

    @property
    def loss_sum(self) -> LossSum:
        """The exact sum of the microbatch losses (any order, any data holder split)."""
        return LossSum.of(self.losses.values())

    @property
    def mean_loss(self) -> float:
        mean = self.loss_sum.mean
        if mean is None:
            raise ValueError("no microbatch finished this iteration")
        return mean

    def replicas_in_sync(self) -> bool:
        """True if every stage's replicas, and all data holders, computed the same squared norm and
        ended with one state hash."""
        parts = [*self.stage_steps, self.data_holder_steps]
        hashes = all(len({r.state_hash for r in steps}) == 1 for steps in parts if steps)
        return hashes and all(len(set(map(repr, norms))) == 1 for norms in self.part_sq_norms)


class PipelineHarness:
    """Data holders and stage replicas of one run, all in this process."""

    def __init__(self, spec: RunSpec, vocab_size: int | None = None, *, replicas: int | Sequence[int] = 1,
                 data_holders: int = 1, dropout: float = 0.0) -> None:
        self.spec = spec
        parts = build_parts(spec, vocab_size, dropout=dropout)
        counts = [replicas] * spec.n_stages if isinstance(replicas, int) else list(replicas)
        if len(counts) != spec.n_stages or min(counts) < 1 or data_holders < 1:
            raise ValueError("need >= 1 data holder and >= 1 replica for each stage")
        self._stage_templates = parts.stages
        self.data_holders = [DataHolderExecutor(copy.deepcopy(parts.data_holder), spec)
                             for _ in range(data_holders)]
        self.stages = [[StageExecutor(copy.deepcopy(module), spec, k + 1) for _ in range(n)]
                       for k, (module, n) in enumerate(zip(parts.stages, counts, strict=True))]

    def add_replica(self, stage_index: int) -> StageExecutor:
        """A new replica of stage ``stage_index`` (1-based) that downloads replica 0's state."""
        fresh = StageExecutor(copy.deepcopy(self._stage_templates[stage_index - 1]), self.spec, stage_index)
        source = self.stages[stage_index - 1][0]
        fresh.load_state_bytes(source.state_bytes(), expected_hash=source.state_hash())
        self.stages[stage_index - 1].append(fresh)
        return fresh

    def remove_replica(self, stage_index: int, replica: int) -> None:
        """Replica ``replica`` of stage ``stage_index`` leaves (between iterations)."""
        group = self.stages[stage_index - 1]
        if len(group) == 1:
            raise ValueError(f"stage {stage_index} would have no replica left")
        del group[replica]

    def run_iteration(self, iteration: int, batches: Mapping[int, Sequence[torch.Tensor]], *,
                      routes: Mapping[str, Sequence[int]] | None = None, order_seed: int = 0,
                      resends: Mapping[str, tuple[int, int]] | None = None) -> IterationResult:
        """Train one iteration on ``batches`` (data holder index -> its microbatches' token ids).

        ``routes`` maps a microbatch id to its replica index per stage (default: seeded random).
        ``resends`` maps an id to (stage, replica): after that stage's forward, the same input is
        sent again to that replica, which recomputes the hop and carries the rest of the path;
        the first replica frees its state (the protocol's recovery after a lost hop); the same
        replica recomputes and replaces its state (a retried hop).
        """
        ids = {microbatch_id(d, iteration, i): (d, x) for d, xs in batches.items() for i, x in enumerate(xs)}
        sizes = [len(group) for group in self.stages]
        if routes is None:
            routes = random_routes(list(ids), sizes, order_seed + iteration)
        flights = {mb: _Flight(mb, d, x, list(routes[mb])) for mb, (d, x) in ids.items()}
        result = IterationResult({}, [], [])
        rng = random.Random(f"{order_seed}/{iteration}")
        active = sorted(flights)
        while active:
            mb = active[rng.randrange(len(active))]
            if self._advance(flights[mb], result, resends or {}):
                active.remove(mb)
        self._aggregate(result, rng)
        return result

    def _advance(self, f: _Flight, result: IterationResult, resends: Mapping[str, tuple[int, int]]) -> bool:
        """Run the next hop of one microbatch; True when its whole round trip is over."""
        n_stages, dh = len(self.stages), self.data_holders[f.dh]
        if f.hop == 0:
            f.tensor = dh.head_forward(f.mb, f.ids)
        elif f.hop <= n_stages:
            k = f.hop
            stage_input = f.tensor
            f.tensor = self.stages[k - 1][f.path[k - 1]].forward(f.mb, stage_input)
            if f.mb in resends and resends[f.mb][0] == k:
                alt = resends[f.mb][1]
                again = self.stages[k - 1][alt].forward(f.mb, stage_input)  # same replica: replaces its state
                result.recompute_bitwise_equal.append(torch.equal(again, f.tensor))
                if alt != f.path[k - 1]:
                    self.stages[k - 1][f.path[k - 1]].drop(f.mb)
                f.path[k - 1], f.tensor = alt, again
        elif f.hop == n_stages + 1:
            result.losses[f.mb], f.tensor = dh.tail_backward(f.mb, f.tensor)
        elif f.hop <= 2 * n_stages + 1:
            k = 2 * n_stages + 2 - f.hop
            f.tensor = self.stages[k - 1][f.path[k - 1]].backward(f.mb, f.tensor)
        else:
            dh.head_backward(f.mb, f.tensor)
            return True
        f.hop += 1
        return False

    def _aggregate(self, result: IterationResult, rng: random.Random) -> None:
        """The step protocol: per part, all-gather and reduce (each replica receives the contributions
        in its own order); per replica, the part's squared norm; the total; every replica steps."""
        parts: list[tuple[str, list[Trainable]]] = [("d", list(self.data_holders))]
        parts += [(f"s{k}r", list(group)) for k, group in enumerate(self.stages, start=1)]
        reduced = []
        for prefix, replicas in parts:
            contributions = [rep.grad_contribution(f"{prefix}{i}") for i, rep in enumerate(replicas)]
            means = [rep.reduce(rng.sample(contributions, len(contributions))) for rep in replicas]
            norms = [rep.grad_sq_norm(mean) for rep, (mean, _) in zip(replicas, means, strict=True)]
            result.part_sq_norms.append(norms)
            reduced.append(means)
        if self.spec.clip_mode == "global":  # each part sends replica 0's; all replicas computed the same
            sent = [norms[0] for norms in result.part_sq_norms]
            result.total_sq_norm = global_sq_norm(rng.sample(sent, len(sent)))
        steps = [[rep.apply_mean(mean, count, total_sq_norm=result.total_sq_norm)
                  for rep, (mean, count) in zip(replicas, means, strict=True)]
                 for (_, replicas), means in zip(parts, reduced, strict=True)]
        result.data_holder_steps, result.stage_steps = steps[0], steps[1:]

    def part_parameters(self, replica: int = 0, data_holder: int = 0) -> list[list[torch.nn.Parameter]]:
        """Parameters of [data holder, stage 1..S] (one replica each), in ``ModelParts.groups`` order."""
        return [self.data_holders[data_holder].params] + [group[min(replica, len(group) - 1)].params
                                                         for group in self.stages]


@dataclass
class _Flight:
    mb: str
    dh: int
    ids: torch.Tensor
    path: list[int]
    hop: int = 0
    tensor: torch.Tensor | None = None
