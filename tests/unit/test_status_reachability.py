"""``gwtf status`` says how the swarm's nodes are reached: directly, or behind a NAT through relays."""

from __future__ import annotations

from rich.console import Console

from gwtf_cli.status_cmd import render


def node(peer: str, relayed: bool) -> dict:
    return {"peer_id": peer, "role": "relay", "stage": 1, "state": "online", "relayed": relayed, "iteration": 3,
            "capacity": 16, "compute_ms": 1.0, "location": "", "hash": "ab", "units_out": 1}


def test_the_reachability_line_counts_relayed_nodes() -> None:
    summary = {"run_id": "0123456789abcdef", "spec": {"model_family": "gpt2", "model_preset": "tiny", "n_stages": 1},
               "iteration": 3, "loss": 1.0, "tokens_per_s": 10.0, "replicas_in_sync": True, "unserved_stages": [],
               "flow": {"units": 2, "cost_s": 0.1, "oracle_units": 2, "oracle_cost_s": 0.1}, "stages": [],
               "nodes": [node("12D3KooWa", False), node("12D3KooWb", True), node("12D3KooWc", False)],
               "routing": []}
    console = Console(record=True, width=160)
    render(summary, console)
    text = console.export_text()
    assert "reachability: 2 node(s) reachable directly, 1 behind a NAT reached through relays" in text
    assert "online relayed" in text
