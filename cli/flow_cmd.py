"""``gwtf flow solve``: the decentralized flow protocol next to the centralized oracle.

Generates an instance (family, seed, sizes) or reads one from JSON, runs the FlowNode protocol on
the in-memory bus (optionally with message loss, reordering and churn) and prints both results
as a table, or as one JSON object with ``--json``.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from gwtfp2p.config import ConfigError, FlowParams
from gwtfp2p.flow.generate import DEFAULT_SHAPES, FamilyShape, generate
from gwtfp2p.flow.instance import FlowInstance, InstanceError

flow_app = typer.Typer(no_args_is_help=True, help="The decentralized flow algorithm (GWTF) and its oracle.")


class Family(str, Enum):
    a = "a"
    b = "b"
    geo10 = "geo10"


class Churn(str, Enum):
    none = "none"
    remove = "remove"
    add = "add"


def _instance(family: Family, seed: int, stages: int | None, relays: int | None, holders: int | None,
              supply: int | None, instance_file: Path | None) -> FlowInstance:
    if instance_file is not None:
        try:
            return FlowInstance.from_json(instance_file.read_text())
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {instance_file}: {exc}", param_hint="--instance") from exc
        except InstanceError as exc:
            raise typer.BadParameter(str(exc), param_hint="--instance") from exc
    base = DEFAULT_SHAPES[family.value]
    shape = FamilyShape(stages or base.n_stages, relays or base.relays_per_stage, holders or base.data_holders,
                        supply if supply is not None else base.supply)
    return generate(family.value, seed, shape)


@flow_app.command("solve")
def solve(
    family: Family = typer.Option(Family.geo10, help="Generated instance family (ignored with --instance)."),
    seed: int = typer.Option(0, help="Seed of the instance and of the protocol run."),
    stages: int | None = typer.Option(None, min=1, help="Relay stages (default: the family's)."),
    relays_per_stage: int | None = typer.Option(None, min=1, help="Relays per stage."),
    data_holders: int | None = typer.Option(None, min=1, help="Data holders."),
    supply: int | None = typer.Option(None, min=0, help="Microbatches each data holder wants per iteration."),
    instance: Path | None = typer.Option(None, help="Read the instance from this JSON file instead."),
    loss: float = typer.Option(0.0, min=0.0, max=0.9, help="Probability that a protocol message is lost."),
    jitter_ticks: int = typer.Option(0, min=0, help="Extra random delay per message, in ticks (reordering)."),
    churn: Churn = typer.Option(Churn.none, help="After convergence, remove or add 20% of the relays."),
    max_ticks: int = typer.Option(2000, min=1, help="Give up after this many ticks."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Solve one instance with the decentralized protocol and with the oracle."""
    graph = _instance(family, seed, stages, relays_per_stage, data_holders, supply, instance)
    try:
        from gwtfp2p.flow.bus import MessageBus, NetworkModel  # the protocol loads when it runs (fast --help)

        bus = MessageBus(graph, seed=seed, params=FlowParams(), network=NetworkModel(1, jitter_ticks, loss))
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from exc
    result = bus.run(max_ticks=max_ticks)
    recovery = None
    if churn is not Churn.none:
        from gwtfp2p.flow.churn import add_relays, remove_relays

        change = remove_relays if churn is Churn.remove else add_relays
        changed = change(bus, graph, 0.2, seed)
        recovery = bus.run(max_ticks=max_ticks)
        result = recovery
        if not as_json:
            typer.echo(f"{churn.value}: {', '.join(changed)}", err=True)
    from gwtfp2p.flow.oracle import solve as oracle_solve  # scipy and networkx: imported when solving

    oracle = oracle_solve(bus.instance()).quality
    q = result.quality
    report = {
        "flow_value": q.flow_value, "oracle_flow_value": oracle.flow_value,
        "total_cost": q.total_cost, "oracle_total_cost": oracle.total_cost,
        "max_path_cost": q.max_path_cost, "oracle_max_path_cost": oracle.max_path_cost,
        "ticks": result.ticks_to_converge, "messages": result.messages_to_converge,
        "messages_per_node": result.messages_to_converge / max(1, len(bus.nodes)),
        "converged": result.converged, "nodes": len(bus.nodes), "churn": churn.value,
    }
    if as_json:
        print(json.dumps(report))
        return
    _print_table(report)


def _print_table(report: dict) -> None:
    table = Table(title="decentralized flow (GWTF) vs centralized oracle")
    table.add_column("")
    table.add_column("decentralized", justify="right")
    table.add_column("oracle", justify="right")
    table.add_column("ratio", justify="right")
    for label, key in (("flow value (units)", "flow_value"), ("total cost", "total_cost"),
                       ("max path cost", "max_path_cost")):
        ours, best = report[key], report[f"oracle_{key}"]
        table.add_row(label, f"{ours:.4g}", f"{best:.4g}", f"{ours / best:.3f}" if best else "-")
    Console().print(table)
    print(f"converged: {report['converged']} after {report['ticks']} ticks, "
          f"{report['messages_per_node']:.0f} messages per node ({report['nodes']} nodes)")
