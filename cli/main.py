"""The ``gwtf`` typer application: wires sub-command groups together and nothing else.

Each command group lives in its own module; output to the terminal happens only in cli/.
"""

from __future__ import annotations

import typer

from gwtf_cli.demo_cmd import demo
from gwtf_cli.flow_cmd import flow_app
from gwtf_cli.join_cmd import join
from gwtf_cli.sim_cmd import sim
from gwtf_cli.status_cmd import status

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="gwtf: train one LLM together on volunteer GPUs (GWTF).")
app.add_typer(flow_app, name="flow")
app.command()(join)
app.command()(demo)
app.command()(sim)
app.command()(status)


@app.callback()
def main() -> None:
    """gwtf: churn-tolerant decentralized training (GWTF)."""


if __name__ == "__main__":
    app()
