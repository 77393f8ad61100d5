"""Simulated nodes: liveness, memory slots and one GPU each with a compute queue.

A node runs one task at a time, backward tasks first (as in 1F1B schedules). A forward keeps its
activations in one of the node's memory slots until its backward; when every slot is taken, the
forward runs without keeping them (activation checkpointing) and its backward recomputes it first.
A stateless forward (SWARM's servers) never keeps them: its backward always recomputes. A paused
node (a stage stepping) finishes its running task and starts no other until resumed. Busy and
per-iteration compute time are accounted here for the idle and waste metrics. Owns no routing and
no recovery.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from gwtfp2p.sim.churn import NodePlan
from gwtfp2p.sim.compute import NodeCompute
from gwtfp2p.sim.engine import Engine

FORWARD, BACKWARD, LOSS = 0, 1, 2  # LOSS: a data holder's tail forward + backward (no slot)
STATELESS_FORWARD = 3  # a forward that keeps nothing for its backward (SWARM's no-grad forward)


class SimNode:
    """One volunteer (relay) or data holder as the simulator tracks it."""

    __slots__ = (
        "active",
        "alive",
        "backward_queue",
        "backward_s",
        "born_s",
        "busy_s",
        "died_s",
        "forward_queue",
        "forward_s",
        "iteration_compute_s",
        "mbs",
        "node_id",
        "paused",
        "plan",
        "running",
        "slot_holders",
        "slots",
        "stage",
        "suspects",
        "task_start",
    )

    def __init__(self, plan: NodePlan, compute: NodeCompute, born_s: float) -> None:
        self.node_id = plan.node_id
        self.stage = plan.stage
        self.plan = plan
        self.forward_s = compute.forward_s
        self.backward_s = compute.backward_s
        self.slots = compute.slots
        self.alive = True
        self.active = False  # serving (joined and past its first iteration boundary)
        self.forward_queue: deque = deque()
        self.backward_queue: deque = deque()
        self.running: tuple | None = None
        self.paused = False  # stepping: no new task starts until resumed
        self.task_start = 0.0
        self.slot_holders: set[str] = set()  # microbatch ids whose activations are held here
        self.busy_s = 0.0
        self.iteration_compute_s = 0.0  # compute whose result lives only here until aggregation
        self.born_s = born_s
        self.died_s = float("inf")
        self.mbs: dict = {}  # microbatch id -> microbatch, for every one this node holds a position of
        self.suspects: set[str] = set()  # peers this node found dead through a failed send

    @property
    def is_data_holder(self) -> bool:
        return self.stage == 0


PHASE_OF_TASK = {FORWARD: "forward", STATELESS_FORWARD: "forward", BACKWARD: "backward", LOSS: "loss"}


def crash_phase(node: SimNode, aggregating: bool) -> str:
    """What ``node`` was doing when it died (for the metrics)."""
    if aggregating:
        return "aggregation"
    if not node.active:
        return "joining"
    if node.running is not None:
        return PHASE_OF_TASK[node.running[0]]
    return "holding" if node.slot_holders else "idle"


class Cluster:
    """All nodes ever created, their compute queues, and the live/active sets per stage."""

    def __init__(self, engine: Engine, n_stages: int) -> None:
        self.engine = engine
        self.n_stages = n_stages
        self.nodes: dict[str, SimNode] = {}
        self.active_by_stage: list[list[str]] = [[] for _ in range(n_stages + 1)]
        self.on_task_done: Callable[[SimNode, tuple], None] = lambda node, task: None
        self.on_paused_idle: Callable[[SimNode], None] = lambda node: None
        self.discarded_s = 0.0  # compute of stale tasks whose result nobody wanted

    def add(self, node: SimNode) -> None:
        self.nodes[node.node_id] = node

    def activate(self, node: SimNode) -> None:
        node.active = True
        members = self.active_by_stage[node.stage]
        members.append(node.node_id)
        members.sort()

    def kill(self, node: SimNode, now: float) -> float:
        """The node dies; returns the compute lost with it (its gradients and the running task)."""
        node.alive = False
        node.died_s = now
        if node.active:
            self.active_by_stage[node.stage].remove(node.node_id)
        node.active = False
        lost = node.iteration_compute_s
        if node.running is not None:
            partial = now - node.task_start
            lost += partial
            node.busy_s += partial
        node.running = None
        node.forward_queue.clear()
        node.backward_queue.clear()
        node.slot_holders.clear()
        return lost

    # -- compute queue -------------------------------------------------------------------
    def submit(self, node: SimNode, task: tuple) -> None:
        """task = (kind, microbatch, position, attempt, duration_s)."""
        (node.backward_queue if task[0] in (BACKWARD, LOSS) else node.forward_queue).append(task)
        if node.running is None:
            self._start_next(node)

    def pause(self, node: SimNode) -> bool:
        """Start no new task on ``node``; True if it is idle already (else ``on_paused_idle`` follows)."""
        node.paused = True
        return node.running is None

    def resume(self, node: SimNode) -> None:
        node.paused = False
        if node.alive and node.running is None:
            self._start_next(node)

    def _start_next(self, node: SimNode) -> None:
        if node.paused:
            return
        if node.backward_queue:
            task = node.backward_queue.popleft()
        elif node.forward_queue:
            task = node.forward_queue.popleft()
            if task[0] == FORWARD:  # a stateless forward keeps nothing
                if len(node.slot_holders) < node.slots or node.is_data_holder:
                    node.slot_holders.add(task[1].mb_id)
                else:
                    task[1].checkpointed[task[2]] = True  # no slot: keep only the input, recompute later
        else:
            return
        node.running = task
        node.task_start = self.engine.now
        self.engine.at(self.engine.now + task[4], self._finish, node, task)

    def _finish(self, node: SimNode, task: tuple) -> None:
        if not node.alive or node.running is not task:
            return
        node.running = None
        node.busy_s += task[4]
        self.on_task_done(node, task)
        if node.running is None and node.alive:
            if node.paused:
                self.on_paused_idle(node)
            else:
                self._start_next(node)

    @staticmethod
    def release_slot(node: SimNode, mb_id: str) -> None:
        node.slot_holders.discard(mb_id)

    @staticmethod
    def backward_s(node: SimNode, m, pos: int) -> float:
        """Backward time of ``m`` at ``pos``: plus a forward recomputation if its activations were not kept."""
        return node.backward_s + (node.forward_s if m.checkpointed[pos] else 0.0)

    def drop_queued(self, node: SimNode, mb_id: str) -> None:
        """Forget queued tasks of a microbatch this node no longer serves."""
        for queue in (node.forward_queue, node.backward_queue):
            if any(t[1].mb_id == mb_id for t in queue):
                kept = [t for t in queue if t[1].mb_id != mb_id]
                queue.clear()
                queue.extend(kept)
        self.release_slot(node, mb_id)
