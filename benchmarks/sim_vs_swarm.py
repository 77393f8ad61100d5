"""Benchmark: the simulator's prediction against a measured swarm, on the same model, network and compute.

    .venv/bin/python benchmarks/sim_vs_swarm.py [--swarm docs/data/bench_bandwidth-compute.json]
        [--out docs/data/sim_vs_swarm.json] [--latency-s 0.001]

For every rate and codec of a ``benchmarks/bench_bandwidth.py`` run (a data holder and 2 stages × 2
relays of capacity 2, every uplink capped by ``tc tbf``), simulates the same swarm with gwtf's router:
the ``gpt2-small`` model (gwtf's ``small`` preset as the daemon sends it: float32 hidden states and
int64 contributions under ``none``), the ``lab`` network (one LAN; each node's uploads share one uplink
at the rate the run's raw TCP check measured through the cap), each stage's compute the median of what
that run's daemons measured (``compute_ms``), the daemons' flow tick, no churn, as many iterations.
The compute figures are inputs measured in the same run; the throughput is the prediction. Where the
run saved its links' byte counters, a second prediction sets each uplink to the cap times the share
of the links' bytes that was payload (headers, framing, the DHT and control messages take the rest). Prints
measured and predicted tokens/s and speed-ups over ``none`` side by side; asserts nothing. Results:
docs/bandwidth.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gwtfp2p.sim.compute import MODELS
from gwtfp2p.sim.network import NetworkSpec
from gwtfp2p.sim.params import Scenario
from gwtfp2p.sim.simulation import Simulation

ROOT = Path(__file__).resolve().parents[1]
MODEL = "gpt2-small"
STAGES = {"dh": 0, "r1a": 1, "r1b": 1, "r2a": 2, "r2b": 2}  # bench_bandwidth's nodes and their stages
RELAY_CAPACITY = 2
MICROBATCHES = 4  # bench_bandwidth's microbatches per iteration (one data holder)
TICK_S = 0.25  # the daemons' --tick-s (localswarm FAST)


def check_setup(swarm: dict) -> None:
    """Refuse a run whose model or swarm shape the simulated one does not match."""
    setup, spec, model = swarm["setup"], swarm["spec"], MODELS[MODEL]
    want = {"model_family": "gpt2", "model_preset": "small", "n_stages": 2, "microbatch_size": model.microbatch,
            "seq_len": model.seq_len, "microbatches_per_dh": MICROBATCHES}
    wrong = {k: spec.get(k) for k, v in want.items() if spec.get(k) != v}
    if wrong:
        raise SystemExit(f"--swarm: the simulator's {MODEL} is {want}; this run has {wrong}")
    if not all("compute_ms" in run for result in swarm["results"] for run in result["runs"]):
        raise SystemExit("--swarm: a run without compute_ms (bench_bandwidth.py before 7 Dec 2026); re-run it")
    if setup["iterations"] <= setup["warmup"] + 1:
        raise SystemExit("--swarm: the run needs two timed iterations after its warm-up (a pace)")
    if not all(len(run.get("iteration_ended_s") or []) == run["iterations"]
               for result in swarm["results"] for run in result["runs"]):
        raise SystemExit("--swarm: a run without its iterations' ends (bench_bandwidth.py before 7 Dec 2026)")


def stage_compute_s(run: dict) -> tuple[float, float, float]:
    """Per stage (data holder, 1, 2): the median of its daemons' measured seconds per microbatch."""
    per_stage: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for name, ms in run["compute_ms"].items():
        per_stage[STAGES[name]].append(ms / 1000)
    missing = [stage for stage, values in per_stage.items() if not values]
    if missing:
        raise SystemExit(f"--swarm: {run['codec']}: no compute figure for stage(s) {missing}")
    return tuple(statistics.median(values) for _, values in sorted(per_stage.items()))


def scenario_for(run: dict, uplink_mbit: float, iterations: int, latency_s: float) -> Scenario:
    compute = stage_compute_s(run)
    return Scenario(
        name=f"lab-{uplink_mbit:.1f}mbit-{run['codec']}", model=MODEL, n_stages=2, relays_per_stage=2,
        data_holders=1, microbatches_per_dh=MICROBATCHES, codec=run["codec"], max_slots=RELAY_CAPACITY,
        flow_tick_s=TICK_S,
        network=NetworkSpec("lab", uniform_latency_s=latency_s, lab_uplink_mbit=uplink_mbit),
        target_microbatches=MICROBATCHES * iterations, horizon_s=24 * 3600.0, stage_compute_s=compute,
        description="benchmarks/bench_bandwidth.py's swarm: measured compute, uplinks capped at the measured rate")


def predict(scenario: Scenario, warmup: int) -> dict:
    """The simulated swarm's tokens/s: tokens per iteration over the median iteration after the warm-up."""
    sim = Simulation(scenario, seed=0, router="gwtf")
    result = sim.run()
    iterations = sim.metrics.iterations[warmup:] or sim.metrics.iterations
    iteration_s = statistics.median(end - start for _, start, end in iterations)
    aggregated = sim.metrics.aggregations
    model = sim.model
    tokens = scenario.microbatches_per_dh * scenario.data_holders * model.tokens
    return {"iteration_s": iteration_s, "tokens_per_s": tokens / iteration_s,
            "iterations": len(sim.metrics.iterations), "completed": result.summary.completed,
            "activation_bytes": model.activation_bytes, "stage_compute_s": list(scenario.stage_compute_s),
            "microbatch_phase_s": statistics.median(aggregated[i] - start for i, start, _ in iterations),
            "aggregation_phase_s": statistics.median(end - aggregated[i] for i, _, end in iterations)}


def timed_periods(run: dict, warmup: int) -> list[tuple[float, float]]:
    """``(period, span)`` of each timed iteration after the first: the time from the previous iteration's
    end to its own, and its own span (the data holder's first forward to its last gradient)."""
    ends, spans = run["iteration_ended_s"], run["iteration_seconds"]
    return [(ends[i] - ends[i - 1], spans[i]) for i in range(warmup + 1, len(ends))]


def measured_phases(run: dict, warmup: int) -> dict:
    """The timed iterations' two phases as the data holder saw them (medians): its microbatches (the
    iteration event's ``seconds``) and the rest of the period (the relays' aggregation and steps)."""
    periods = timed_periods(run, warmup)
    return {"microbatch_phase_s": statistics.median(span for _, span in periods),
            "aggregation_phase_s": statistics.median(period - span for period, span in periods)}


def host_cpu(run: dict, predicted: dict) -> dict | None:
    """How busy the host's cores were over the timed iterations (runs that saved ``cpu``): the share of
    their time busy, the CPU seconds per iteration the host and the daemons used, the least period those
    alone allow (busy seconds over the cores), and the compute the simulator is given per iteration (each
    of the 4 microbatches' measured forward + backward at the data holder and one relay per stage: wall
    time of the compute threads, waits for a core included)."""
    cpu = run.get("cpu")
    if not cpu or cpu.get("iterations", 0) <= 0:
        return None
    iterations = cpu["iterations"]
    daemons_s = sum(cpu["node_cpu_s"].values()) / iterations
    busy_s = cpu["host_busy_s"] / iterations
    return {"utilization": cpu["host_utilization"], "cores": cpu["cores"], "host_busy_s_per_iteration": busy_s,
            "daemons_cpu_s_per_iteration": daemons_s, "cpu_floor_s": busy_s / cpu["cores"],
            "simulated_compute_s_per_iteration": MICROBATCHES * sum(predicted["stage_compute_s"])}


def measured_period_tokens_per_s(run: dict, warmup: int, tokens: int) -> float:
    """Tokens over the median time between the ends of consecutive timed iterations: the swarm's pace,
    the relays' aggregation and step included (the daemon's own tokens/s counts an iteration from its
    first forward to its last gradient, without them). The simulator's iterations follow each other
    back to back, so its median iteration is its pace."""
    return tokens / statistics.median(period for period, _ in timed_periods(run, warmup))


def payload_share(run: dict) -> float | None:
    """The daemons' counted payload (hops and contributions) over all their hosts' links sent (the kernel's
    counters: headers, framing, the DHT, control messages, start-up), when the run saved both. ``tc tbf``
    caps what those counters count, so the payload's rate is the cap times this share."""
    sent, by_node = run.get("link_tx_bytes"), run.get("traffic_by_node")
    if not sent or not by_node:
        return None
    kinds = ("forward_bytes", "backward_bytes", "aggregation_bytes")
    payload = sum(t.get(k, 0) for t in by_node.values() for k in kinds)
    total = sum(sent.values())
    return payload / total if total > 0 and payload > 0 else None


def compare(swarm: dict, latency_s: float) -> list[dict]:
    setup = swarm["setup"]
    tokens = MICROBATCHES * MODELS[MODEL].tokens
    rows = []
    for result in swarm["results"]:
        for run in result["runs"]:
            scenario = scenario_for(run, result["measured_mbit"], setup["iterations"], latency_s)
            share = payload_share(run)
            row = {"rate_mbit": result["rate_mbit"], "measured_mbit": result["measured_mbit"],
                   "codec": run["codec"], "measured_tokens_per_s": run["tokens_per_s"],
                   "measured_iteration_s": run["iteration_s"],
                   "measured_period_tokens_per_s": measured_period_tokens_per_s(run, setup["warmup"], tokens),
                   "compute_ms": run["compute_ms"], "predicted": predict(scenario, setup["warmup"]),
                   "measured_phases": measured_phases(run, setup["warmup"]),
                   "payload_share": share, "predicted_payload_rate": None}
            row["host_cpu"] = host_cpu(run, row["predicted"])
            if share is not None:  # the uplink at the rate the payload really gets
                rated = scenario_for(run, result["rate_mbit"] * share, setup["iterations"], latency_s)
                row["predicted_payload_rate"] = predict(rated, setup["warmup"])
            rows.append(row)
    return rows


def report(rows: list[dict]) -> None:
    """Per rate and codec: the measured pace and the prediction, and each one's speed-up over ``none``."""
    print(f"{'rate':>6} {'codec':<11}{'compute ms dh/s1/s2':>21}{'daemon t/s':>12}{'pace t/s':>10}"
          f"{'predicted':>11}{'pred/pace':>10}{'speed-up pace':>15}{'pred':>7}")
    for rate in sorted({r["rate_mbit"] for r in rows}, reverse=True):
        at_rate = [r for r in rows if r["rate_mbit"] == rate]
        base = next(r for r in at_rate if r["codec"] == "none")
        for r in at_rate:
            p, pace = r["predicted"], r["measured_period_tokens_per_s"]
            compute = "/".join(f"{s * 1000:.0f}" for s in p["stage_compute_s"])
            speed_up = pace / base["measured_period_tokens_per_s"]
            print(f"{rate:>6g} {r['codec']:<11}{compute:>21}{r['measured_tokens_per_s']:>12.0f}{pace:>10.0f}"
                  f"{p['tokens_per_s']:>11.0f}{p['tokens_per_s'] / pace:>9.2f}x{speed_up:>14.2f}x"
                  f"{p['tokens_per_s'] / base['predicted']['tokens_per_s']:>6.2f}x")
            rated = r["predicted_payload_rate"]
            if rated is not None:
                print(f"{'':>18}payload {100 * r['payload_share']:.1f} % of the links' bytes: at the cap times that, "
                      f"predicted {rated['tokens_per_s']:.0f} tokens/s, {rated['tokens_per_s'] / pace:.2f}x the pace")
            phases(r)


def phases(r: dict) -> None:
    """One row's phases, measured and predicted, and how busy the host was."""
    m, p = r["measured_phases"], r["predicted_payload_rate"] or r["predicted"]
    print(f"{'':>18}microbatches {m['microbatch_phase_s']:.2f} s, predicted {p['microbatch_phase_s']:.2f}; "
          f"aggregation and step {m['aggregation_phase_s']:.2f} s, predicted {p['aggregation_phase_s']:.2f}")
    cpu = r["host_cpu"]
    if cpu is not None:
        print(f"{'':>18}host CPU busy {100 * cpu['utilization']:.0f} %: {cpu['host_busy_s_per_iteration']:.2f} CPU s "
              f"an iteration (daemons {cpu['daemons_cpu_s_per_iteration']:.2f}; the simulator's compute "
              f"{cpu['simulated_compute_s_per_iteration']:.2f} s), at least {cpu['cpu_floor_s']:.2f} s on "
              f"{cpu['cores']} cores")


def plot(rows: list[dict], path: Path) -> None:
    """Per rate: measured pace and predicted tokens/s per codec, bars side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate_mbit"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(rates), figsize=(4.4 * len(rates), 3.6), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        at_rate = [r for r in rows if r["rate_mbit"] == rate]
        x = range(len(at_rate))
        series = [([r["measured_period_tokens_per_s"] for r in at_rate], "measured swarm (pace)", "tab:blue"),
                  ([r["predicted"]["tokens_per_s"] for r in at_rate], "simulator, uplink = raw TCP rate", "tab:orange")]
        if all(r.get("predicted_payload_rate") for r in at_rate):
            series.append(([r["predicted_payload_rate"]["tokens_per_s"] for r in at_rate],
                           "simulator, uplink = cap x payload share", "tab:green"))
        width = 0.4 if len(series) == 2 else 0.27
        for k, (values, label, color) in enumerate(series):
            offset = (k - (len(series) - 1) / 2) * width
            ax.bar([i + offset for i in x], values, width, label=label, color=color)
        ax.set_xticks(list(x), [r["codec"] for r in at_rate])
        ax.set_title(f"uplinks capped at {rate:g} Mbit/s", fontsize=9)
        ax.set_ylabel("tokens/s")
        tallest = max(max(r["measured_period_tokens_per_s"], r["predicted"]["tokens_per_s"]) for r in at_rate)
        ax.set_ylim(0, 1.4 * tallest)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("The simulator against the measured swarm it models\n"
                 "(gpt2 small, data holder + 2 stages x 2 relays, compute measured in the same run)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def plot_phases(rows: list[dict], path: Path) -> None:
    """Per rate: each codec's iteration split into its microbatches and its aggregation and step, measured
    beside predicted (at the cap x payload share where the run has it), stacked bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate_mbit"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(rates), figsize=(4.4 * len(rates), 3.6), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        at_rate = [r for r in rows if r["rate_mbit"] == rate]
        for i, r in enumerate(at_rate):
            predicted = r["predicted_payload_rate"] or r["predicted"]
            for dx, phases, label in ((-0.2, r["measured_phases"], "measured"), (0.2, predicted, "predicted")):
                mb, agg = phases["microbatch_phase_s"], phases["aggregation_phase_s"]
                color = "tab:blue" if label == "measured" else "tab:green"
                ax.bar(i + dx, mb, 0.38, color=color, label=f"{label}: microbatches" if i == 0 else None)
                ax.bar(i + dx, agg, 0.38, bottom=mb, color=color, alpha=0.45, hatch="//",
                       label=f"{label}: aggregation and step" if i == 0 else None)
        ax.set_xticks(range(len(at_rate)), [r["codec"] for r in at_rate])
        ax.set_title(f"uplinks capped at {rate:g} Mbit/s", fontsize=9)
        ax.set_ylabel("seconds per iteration (median)")
        ax.legend(fontsize=7)
    fig.suptitle("An iteration's two phases, measured and simulated\n(simulator at the cap x payload share)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swarm", type=Path, default=ROOT / "docs" / "data" / "bench_bandwidth-compute.json",
                        help="a benchmarks/bench_bandwidth.py result with compute_ms")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "data" / "sim_vs_swarm.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "sim-vs-swarm.png")
    parser.add_argument("--latency-s", type=float, default=0.001,
                        help="one-way latency of the simulated LAN (namespaces on one bridge: well under 1 ms)")
    args = parser.parse_args()
    swarm = json.loads(args.swarm.read_text())
    check_setup(swarm)
    rows = compare(swarm, args.latency_s)
    report(rows)
    args.out.write_text(json.dumps({"swarm": str(args.swarm.relative_to(ROOT)) if args.swarm.is_relative_to(ROOT)
                                    else str(args.swarm), "latency_s": args.latency_s, "model": MODEL,
                                    "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    plot(rows, args.plot)
    plot_phases(rows, args.plot.with_name(f"{args.plot.stem}-phases{args.plot.suffix}"))


if __name__ == "__main__":
    main()
