"""Where a node gets the run spec: a file, the embedded demo default, or the DHT.

A data holder that starts a run (no ``--initial-peers``, or ``--new-run`` through any bootstrap peer,
a stock ``hivemind-dht`` included) publishes the spec from ``--run-spec FILE`` or the embedded demo
default; every other node reads the current run from the DHT (retrying until the startup deadline,
since a fresh record takes a moment to be found). A joining node given ``--run-spec`` joins only
that run (``preflight.check_same_run``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import fields
from pathlib import Path

from gwtfp2p.config import ConfigError, RunSpec
from gwtfp2p.daemon.config import NodeConfig
from gwtfp2p.daemon.lifecycle.preflight import check_same_run
from gwtfp2p.dht import DHTError, RecordError, RunSpecRecord, SwarmDHT

logger = logging.getLogger(__name__)

DEMO_SPEC = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=0, lr=3e-3, microbatch_size=4,
                    seq_len=64, microbatches_per_dh=4)


def load_run_spec_file(path: str) -> RunSpec:
    """A run spec from a JSON object of ``RunSpec`` fields; ``ConfigError`` naming ``--run-spec``."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--run-spec: cannot read {path!r}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"--run-spec: {path!r} must hold a JSON object of run spec fields")
    known = {f.name for f in fields(RunSpec)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"--run-spec: unknown fields {unknown}; known: {sorted(known)}")
    if isinstance(raw.get("partition"), list):
        raw["partition"] = tuple(raw["partition"])
    try:
        return RunSpec(**raw)
    except TypeError as e:
        raise ConfigError(f"--run-spec: {e}") from e


async def resolve_run_spec(dht: SwarmDHT, config: NodeConfig) -> RunSpec:
    """Publish (a data holder starting a run) or read (everyone else) the run spec."""
    timings = config.timings
    wanted = load_run_spec_file(config.run_spec_path) if config.run_spec_path else None
    if config.is_data_holder and (config.new_run or not config.network.initial_peers):
        spec = wanted or DEMO_SPEC
        await dht.publish_run_spec(RunSpecRecord.from_spec(spec, published_by=dht.peer_id), ttl_s=timings.spec_ttl_s)
        return spec
    spec = await _read_current_run(dht, config)
    check_same_run(wanted, spec)
    return spec


async def _read_current_run(dht: SwarmDHT, config: NodeConfig) -> RunSpec:
    timings = config.timings
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timings.startup_timeout_s
    while True:
        try:
            record = await dht.read_current_run()
        except (DHTError, RecordError) as e:
            logger.debug("reading the current run failed: %s", e)
            record = None
        if record is not None:
            return record.to_spec()
        if loop.time() > deadline:
            raise ConfigError("--initial-peers: the swarm reached through them has no run yet; start one with "
                              "gwtf join --role data --new-run --initial-peers ... (any bootstrap peer, a stock "
                              "hivemind-dht included), then join it")
        await asyncio.sleep(timings.spec_poll_s)
