"""SWARM as released, one test per behaviour, on small seeded swarms.

Heap-picked backward, stateless servers that recompute, sequential trainers with one request in
flight, retry without a ban on a timeout (a ban on a refused connection), per-stage optimizer
steps without a global barrier (and the barrier variant).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from gwtfp2p.sim.churn import Crash
from gwtfp2p.sim.cluster import BACKWARD, STATELESS_FORWARD
from gwtfp2p.sim.params import DataPlaneParams, SwarmParams
from gwtfp2p.sim.simulation import Simulation
from gwtfp2p.sim.swarm.trainers import BWD, FWD
from tests.sim.conftest import small

pytestmark = pytest.mark.timeout(60)


def swarm_sim(router: str = "swarm", **overrides) -> Simulation:
    return Simulation(small(**overrides), 0, router)


def record_sends(sim: Simulation) -> list[tuple]:
    """Every call a trainer opens: (time, trainer, microbatch, kind, stage, server)."""
    trainers, sends = sim.swarm.trainers, []
    original = trainers._send

    def send(trainer, kind, stage, inputs, previous=None):
        original(trainer, kind, stage, inputs, previous)
        sends.append((sim.engine.now, trainer.name, trainer.m.mb_id, kind, stage, trainer.call.server))
    trainers._send = send
    return sends


def record_tasks(sim: Simulation) -> list[tuple]:
    """Every task a relay is given: (node, kind, duration)."""
    tasks, original = [], sim.cluster.submit

    def submit(node, task):
        if not node.is_data_holder:
            tasks.append((node, task[0], task[4]))
        original(node, task)
    sim.cluster.submit = submit
    return tasks


def test_the_backward_is_picked_from_the_heap_like_any_request():
    sim = swarm_sim(target_microbatches=240)
    sends = record_sends(sim)
    picks = []
    original = sim.swarm.trainers._choose
    sim.swarm.trainers._choose = lambda t, stage, size: picks.append(size) or original(t, stage, size)
    sim.run()
    done = {mb for _, _, mb, kind, _, _ in sends if kind == "to-done"}
    forward = {(mb, stage): server for _, _, mb, kind, stage, server in sends if kind == FWD and mb in done}
    backward = [(mb, stage, server) for _, _, mb, kind, stage, server in sends if kind == BWD and mb in done]
    assert len(done) == 240 and len(backward) == len(forward) == 240 * 3
    moved = sum(server != forward[(mb, stage)] for mb, stage, server in backward)
    assert moved > len(backward) / 4  # a backward often lands elsewhere than its forward
    # the heap is charged 2.5 times the forward's task for a backward (balanced_expert.py:75)
    assert Counter(picks)[10.0] == sum(kind == BWD for _, _, _, kind, _, _ in sends)
    assert Counter(picks)[4.0] == sum(kind == FWD for _, _, _, kind, _, _ in sends)


def test_stateless_servers_keep_nothing_and_recompute_the_forward_in_the_backward():
    sim = swarm_sim(target_microbatches=120)
    tasks = record_tasks(sim)
    sim.start()
    while not sim.engine.stopped and sim.engine.now < 3600:
        sim.engine.run(sim.engine.now + 0.5)
        assert all(not n.slot_holders for n in sim.cluster.nodes.values() if not n.is_data_holder)
    kinds = Counter(kind for _, kind, _ in tasks)
    assert set(kinds) == {STATELESS_FORWARD, BACKWARD}
    for node, kind, duration in tasks:
        expected = node.forward_s if kind == STATELESS_FORWARD else node.forward_s + node.backward_s
        assert duration == pytest.approx(expected)


def test_each_trainer_is_sequential_with_one_request_in_flight():
    sim = swarm_sim(target_microbatches=300, swarm=SwarmParams(trainers_per_dh=3))
    sends = record_sends(sim)
    sim.start()
    trainers = sim.swarm.trainers.trainers
    assert len(trainers) == 2 * 3
    while not sim.engine.stopped:
        sim.engine.run(sim.engine.now + 0.25)
        in_flight = Counter()
        for node in sim.cluster.nodes.values():
            for task in [node.running, *node.forward_queue, *node.backward_queue]:
                if task is not None:
                    in_flight[task[1].mb_id] += 1
        assert all(n <= 1 for n in in_flight.values())  # one call, hence one task, per microbatch
        assert len({t.m.mb_id for t in trainers if t.m is not None}) <= 6
    order = defaultdict(list)  # per trainer: forward 1..S, then backward S..1, microbatch after microbatch
    for _, trainer, _mb, kind, stage, _ in sends:
        order[trainer].append((kind, stage))
    cycle = [("forward", s) for s in (1, 2, 3)] + [("to-loss", 4)] + [("backward", s) for s in (3, 2, 1)] + [
        ("to-done", 0)]
    for calls in order.values():
        assert calls[: len(calls) - len(calls) % len(cycle)] == cycle * (len(calls) // len(cycle))


def start_and_find(router_mode: str, kind: str) -> tuple[Simulation, object]:
    """A SWARM run past its warm-up, and a trainer whose open call of ``kind`` waits on a relay."""
    sim = swarm_sim(target_microbatches=10_000, horizon_s=3600.0, dataplane=DataPlaneParams(crash_mode=router_mode))
    sim.start()
    sim.engine.run(60.0)
    for _ in range(100_000):
        for trainer in sim.swarm.trainers.trainers:
            call = trainer.call
            if call is not None and call.kind == kind and sim.cluster.nodes[call.server].alive and call.source is None:
                return sim, trainer
        sim.engine.run(sim.engine.now + 0.001)
    raise AssertionError(f"no {kind} call found")


@pytest.mark.parametrize("kind", [FWD, BWD])
def test_a_timeout_is_retried_on_another_pick_without_a_ban(kind):
    sim, trainer = start_and_find("silent", kind)
    call = trainer.call
    dead = sim.cluster.nodes[call.server]
    sends = record_sends(sim)
    sim.swarm.on_crash(dead, Crash(sim.engine.now, dead.node_id, 0.5))
    timeout = 30.0 if kind == FWD else 75.0
    sim.engine.run(call.sent_s + timeout + 1.0)
    retries = [s for s in sends if s[1] == trainer.name and s[3] == kind and s[4] == call.stage]
    assert retries and retries[0][0] == pytest.approx(call.sent_s + timeout)  # at the deadline, not before
    assert retries[0][5] != dead.node_id  # the heap was charged for the dead one: the next pick differs
    assert dead.node_id in trainer.balancers[call.stage].entry  # not banned: it may be picked again


def test_a_refused_connection_bans_the_server_and_retries_at_once():
    sim, trainer = start_and_find("refused", FWD)
    call = trainer.call
    dead = sim.cluster.nodes[call.server]
    sends = record_sends(sim)
    sim.swarm.on_crash(dead, Crash(sim.engine.now, dead.node_id, 0.5))
    crash_s = sim.engine.now
    sim.engine.run(crash_s + 5.0)
    retries = [s for s in sends if s[1] == trainer.name and s[3] == FWD and s[4] == call.stage]
    assert retries and retries[0][0] == pytest.approx(crash_s + sim.network.link(dead.node_id, trainer.dh)[0])
    assert dead.node_id not in trainer.balancers[call.stage].entry
    assert dead.node_id in trainer.balancers[call.stage].banned


def test_stages_step_on_their_own_and_trainers_never_wait():
    sim = swarm_sim(target_microbatches=600)
    sim.start()
    while not sim.engine.stopped:
        sim.engine.run(sim.engine.now + 0.5)
        assert all(t.m is not None for t in sim.swarm.trainers.trainers)  # nobody waits for a barrier
    steps = sim.metrics.stage_steps
    per_stage = Counter(stage for stage, _, _ in steps)
    assert set(per_stage) == {0, 1, 2, 3}
    per_step = sim.scenario.demand
    assert all(600 // per_step - 2 <= n <= 600 // per_step + 1 for n in per_stage.values())
    times = defaultdict(list)
    for stage, _, now in steps:
        times[stage].append(now)
    assert len({round(t[0], 6) for t in times.values()}) > 1  # the stages' first steps do not coincide
    assert not sim.metrics.iterations


def test_with_the_barrier_every_stage_steps_at_the_iteration_end():
    sim = swarm_sim("swarm-barrier", target_microbatches=600)
    summary = sim.run().summary
    assert 600 // sim.scenario.demand - 1 <= summary.iterations <= 600 // sim.scenario.demand
    assert summary.median_iteration_s > 0
    assert not sim.metrics.stage_steps


def test_a_crash_mid_step_restarts_the_stage_reduction_without_the_node():
    sim = swarm_sim(target_microbatches=10_000, horizon_s=3600.0)
    sim.start()
    steps = sim.swarm.steps
    for _ in range(200_000):
        if 2 in steps.reductions.running:
            break
        sim.engine.run(sim.engine.now + 0.002)
    members = list(steps.reductions.members[2])
    victim = sim.cluster.nodes[members[0]]
    sim.swarm.on_crash(victim, Crash(sim.engine.now, victim.node_id, 0.5))
    before = len(sim.metrics.stage_steps)
    sim.engine.run(sim.engine.now + 30.0)
    assert sim.metrics.allreduce_restarts == 1 and sim.metrics.crashes[-1][2] == "aggregation"
    assert victim.node_id not in steps.reductions.members[2]
    assert len(sim.metrics.stage_steps) > before


def test_the_ablation_switches_do_what_they_say():
    sim = swarm_sim(target_microbatches=60, swarm=SwarmParams(recompute=False, backward_to_forward_server=True))
    sends, tasks = record_sends(sim), record_tasks(sim)
    sim.run()
    forward = {(mb, stage): server for _, _, mb, kind, stage, server in sends if kind == FWD}
    assert all(server == forward[(mb, stage)] for _, _, mb, kind, stage, server in sends if kind == BWD)
    assert all(duration == pytest.approx(node.backward_s) for node, kind, duration in tasks if kind == BACKWARD)
