"""The heartbeat file of ``gwtf join --heartbeat-file``: a live node's proof of life for health checks.

``HeartbeatSink`` wraps the CLI's event sink. From the node's ``ready`` event on, it rewrites a small
JSON file atomically (when, the latest event and iteration, the peer id and addresses) on every
event, at most once per second (``ready``, ``leaving`` and ``stopped`` always). ``python -m
gwtf_cli.heartbeat FILE`` exits 0 while the file is fresh and 1 otherwise: the Docker HEALTHCHECK.
This module imports nothing heavy, so that check costs one small Python start.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gwtfp2p.config import ConfigError

logger = logging.getLogger(__name__)

Event = dict[str, Any]
MIN_INTERVAL_S = 1.0
ALWAYS_WRITTEN = ("ready", "leaving", "stopped")
READY_FIELDS = ("peer_id", "role", "stage", "run_id", "maddrs")
DEFAULT_MAX_AGE_S = 60.0
CLOCK_SKEW_S = 5.0  # a file stamped this far in the future still counts (clock steps)
WARN_EVERY_S = 60.0


class HeartbeatSink:
    """Forwards every event to ``sink``; from ``ready`` on, first rewrites ``path`` at most once per
    ``min_interval_s`` (seconds of ``clock``, wall time by default). A file left by an earlier run
    is removed at once, so a stale one never passes for this node's."""

    def __init__(self, sink: Callable[[Event], None], path: Path, *, clock: Callable[[], float] = time.time,
                 min_interval_s: float = MIN_INTERVAL_S) -> None:
        self._sink = sink
        self.path = Path(path)
        self._clock = clock
        self.min_interval_s = min_interval_s
        self._ready: Event | None = None
        self._written_at: float | None = None
        self._warned_at: float | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)
        except OSError as e:
            raise ConfigError(f"--heartbeat-file: cannot write {str(self.path)!r} ({e}); give a writable path") from e

    def __call__(self, event: Event) -> None:
        name = event.get("event")
        if name == "ready":
            self._ready = {key: event.get(key) for key in READY_FIELDS}
        if self._ready is not None:
            now = self._clock()
            due = self._written_at is None or now - self._written_at >= self.min_interval_s
            if due or name in ALWAYS_WRITTEN:
                self._write(now, event)
        self._sink(event)  # after the write: whoever sees the event finds the file up to date

    def _write(self, now: float, event: Event) -> None:
        record = {"time": now, "event": event.get("event"), "iteration": event.get("iteration"),
                  "pid": os.getpid(), **(self._ready or {})}
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_text(json.dumps(record, default=str))
            os.replace(temporary, self.path)
        except OSError as e:  # the node keeps running; the health check will report the stale file
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                logger.warning("cannot write the heartbeat file %s: %s", self.path, e)
            return
        self._written_at = now


def with_heartbeat(sink: Callable[[Event], None], path: str | None) -> Callable[[Event], None]:
    """``sink`` wrapped in a ``HeartbeatSink`` writing ``path``; ``sink`` itself when no path is given."""
    return HeartbeatSink(sink, Path(path)) if path else sink


def read_heartbeat(path: Path) -> Event:
    """The heartbeat record; ``ValueError`` saying what is wrong with the file."""
    try:
        record = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"no heartbeat file {str(path)!r} (the node is not ready yet, or not running)") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable heartbeat file {str(path)!r}: {e}") from None
    if not isinstance(record, dict) or not isinstance(record.get("time"), (int, float)):
        raise ValueError(f"heartbeat file {str(path)!r} holds no time stamp")
    return record


def check(path: Path, max_age_s: float, now: float) -> tuple[bool, str]:
    """Whether the heartbeat at ``path`` was written within ``max_age_s`` before ``now``, and why."""
    try:
        record = read_heartbeat(path)
    except ValueError as e:
        return False, str(e)
    age_s = now - record["time"]
    what = f"{record.get('event')} at iteration {record.get('iteration')}, {age_s:.1f} s ago"
    if age_s > max_age_s:
        return False, f"stale: last event {what} (limit {max_age_s:g} s)"
    if age_s < -CLOCK_SKEW_S:
        return False, f"time stamp {-age_s:.1f} s in the future"
    return True, f"alive: last event {what}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gwtf_cli.heartbeat",
                                     description="Exit 0 if a gwtf node's heartbeat file is fresh, 1 if not.")
    parser.add_argument("file", type=Path, help="the file given to gwtf join --heartbeat-file")
    parser.add_argument("--max-age-s", type=float, default=DEFAULT_MAX_AGE_S,
                        help="seconds since the last event after which the node counts as stuck (default 60)")
    parser.add_argument("--print-peer-id", action="store_true",
                        help="print the node's peer id (when fresh), e.g. to build its multiaddr")
    args = parser.parse_args(argv)
    fresh, reason = check(args.file, args.max_age_s, time.time())
    if not fresh:
        print(f"unhealthy: {reason}", file=sys.stderr)
        return 1
    if args.print_peer_id:
        print(read_heartbeat(args.file).get("peer_id") or "")
    else:
        print(reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
