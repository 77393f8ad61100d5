"""Where a node gets the run spec: a file, the embedded demo default, or the DHT.

The first data holder of a run (no ``--initial-peers``) publishes the spec from ``--run-spec FILE``
or the embedded demo default; every other node reads the current run from the DHT (retrying
until the startup deadline, since a fresh record takes a moment to be found).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import fields
from pathlib import Path

from gwtfp2p.config import ConfigError, NodeConfig, RunSpec
from gwtfp2p.dht import DHTError, RecordError, RunSpecRecord, SwarmDHT

logger = logging.getLogger(__name__)
SPEC_TTL_S = 7 * 24 * 3600.0
POLL_S = 0.5

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
    """Publish (first data holder) or read (everyone else) the run spec."""
    if config.is_data_holder and not config.initial_peers:
        spec = load_run_spec_file(config.run_spec_path) if config.run_spec_path else DEMO_SPEC
        await dht.publish_run_spec(RunSpecRecord.from_spec(spec, published_by=dht.peer_id), ttl_s=SPEC_TTL_S)
        return spec
    if config.run_spec_path:
        logger.info("--run-spec is only read by the first data holder; reading the run from the DHT")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.startup_timeout_s
    while True:
        try:
            record = await dht.read_current_run()
        except (DHTError, RecordError) as e:
            logger.debug("reading the current run failed: %s", e)
            record = None
        if record is not None:
            return record.to_spec()
        if loop.time() > deadline:
            raise ConfigError("--initial-peers: the swarm has no run yet; start the first data holder "
                              "(gwtf join --role data) before relays")
        await asyncio.sleep(POLL_S)
