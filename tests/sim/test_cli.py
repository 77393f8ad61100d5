"""``gwtf sim`` end to end on a short run: files written, summary.json readable, clear errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gwtf_cli.main import app

pytestmark = pytest.mark.timeout(120)


def test_sim_writes_table_csv_json_summary_and_plots(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["sim", "--scenario", "ideal-hom-c0-llama500m", "--seeds", "2",
                                      "--target-microbatches", "300", "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "| ideal-hom-c0-llama500m | gwtf |" in result.output
    for name in ("table.md", "runs.csv", "runs.json", "summary.json", "time_to_n.png", "throughput.png"):
        assert (out / name).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"gwtf", "swarm", "oracle"}
    assert summary["swarm"]["crashes"] == 0 and summary["gwtf"]["time_to_n_s"] > 0
    assert len(json.loads((out / "runs.json").read_text())) == 6


def test_sim_lists_scenarios_and_rejects_unknown_ones(tmp_path):
    listed = CliRunner().invoke(app, ["sim", "--list"])
    assert listed.exit_code == 0 and "geo10-het-c33-llama500m" in listed.output
    bad = CliRunner().invoke(app, ["sim", "--scenario", "nowhere", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "--scenario" in bad.output
    bad_router = CliRunner().invoke(app, ["sim", "--scenario", "ideal-hom-c0-llama500m", "--router", "magic",
                                          "--out", str(tmp_path)])
    assert bad_router.exit_code == 2 and "--router" in bad_router.output
