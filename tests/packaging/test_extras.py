"""The ``plots`` extra is optional: without matplotlib the CLI starts and ``gwtf sim`` still writes its
tables (and says how to get the plots); the CLI never imports matplotlib before it draws."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gwtf_cli.main import app

pytestmark = pytest.mark.timeout(120)


def test_gwtf_sim_without_matplotlib_writes_its_tables_and_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # any `import matplotlib` now raises ImportError
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["sim", "--scenario", "ideal-hom-c0-llama500m", "--seeds", "1", "--router",
                                      "gwtf", "--target-microbatches", "100", "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "pip install 'gwtfp2p[plots]'" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["runs.csv", "runs.json", "summary.json", "table.md"]


def test_the_cli_and_the_daemon_start_without_importing_matplotlib():
    code = ("import sys, gwtf_cli.main, gwtf_cli.join_cmd, gwtfp2p.daemon.lifecycle.node, gwtfp2p.sim.plots; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"
