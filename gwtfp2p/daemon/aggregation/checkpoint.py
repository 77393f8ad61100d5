"""Local checkpoints of a part (``--checkpoint-dir``): its state bytes, their hash and iteration.

A relay writes ``gwtf-<run>-stage<k>.ckpt`` every ``--checkpoint-every`` steps: one JSON header
line (format, run id, stage, iteration, state hash, sha256 and size of the bytes), then the state
bytes of ``Trainable.state_bytes``. Writing is atomic (temporary file, fsync, rename), so a crash
mid-write leaves the previous checkpoint. A node joining a stage that has no live replica reads it
back (``read``: header, size and sha256 checked; the caller verifies the state hash on load).
Owns the file format, its I/O and when to write (``CheckpointWriter``).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

FORMAT = 1
MAX_HEADER_BYTES = 4096


class CheckpointError(ValueError):
    """A checkpoint file that is unreadable, truncated, corrupt or of another run or stage."""


@dataclass(frozen=True)
class Checkpoint:
    run_id: str
    stage: int
    iteration: int  # steps contained in the state
    state_hash: str
    data: bytes


def path_for(directory: str | Path, run_id: str, stage: int) -> Path:
    return Path(directory) / f"gwtf-{run_id}-stage{stage}.ckpt"


def write(directory: str | Path, checkpoint: Checkpoint) -> Path:
    """Write atomically (blocking file I/O: call it off the event loop); returns the path."""
    path = path_for(directory, checkpoint.run_id, checkpoint.stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"format": FORMAT, "run_id": checkpoint.run_id, "stage": checkpoint.stage,
              "iteration": checkpoint.iteration, "state_hash": checkpoint.state_hash,
              "sha256": hashlib.sha256(checkpoint.data).hexdigest(), "size": len(checkpoint.data)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
        f.write(checkpoint.data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read(directory: str | Path, run_id: str, stage: int) -> Checkpoint | None:
    """The checkpoint of (run, stage) in ``directory``; None if there is none; ``CheckpointError`` if bad."""
    path = path_for(directory, run_id, stage)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"{path}: {e}") from e
    line, sep, data = raw[:MAX_HEADER_BYTES].partition(b"\n")
    try:
        header = json.loads(line) if sep else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a gwtf checkpoint (format {FORMAT})")
    data = raw[len(line) + 1:]
    if header.get("run_id") != run_id or header.get("stage") != stage:
        raise CheckpointError(f"{path}: belongs to run {header.get('run_id')} stage {header.get('stage')}")
    if header.get("size") != len(data) or header.get("sha256") != hashlib.sha256(data).hexdigest():
        raise CheckpointError(f"{path}: truncated or corrupt (size or sha256 mismatch)")
    iteration, state_hash = header.get("iteration"), header.get("state_hash")
    if not isinstance(iteration, int) or iteration < 0 or not isinstance(state_hash, str):
        raise CheckpointError(f"{path}: bad iteration or state hash in the header")
    return Checkpoint(run_id, stage, iteration, state_hash, data)


class CheckpointWriter:
    """When to write: after every ``every``-th step of a part, skipping a write while one is under way."""

    def __init__(self, directory: str, run_id: str, stage: int, every: int) -> None:
        self.directory = directory
        self.run_id = run_id
        self.stage = stage
        self.every = every
        self.writing = False
        self.written: list[int] = []  # iterations written (the state's steps)

    def due(self, steps: int) -> bool:
        """Whether the state after ``steps`` steps is to be written."""
        return bool(self.directory) and steps > 0 and steps % self.every == 0 and not self.writing

    def save(self, steps: int, state_hash: str, data: bytes) -> Path:
        """Blocking: write the state after ``steps`` steps (call it in a thread)."""
        self.writing = True
        try:
            path = write(self.directory, Checkpoint(self.run_id, self.stage, steps, state_hash, data))
        finally:
            self.writing = False
        self.written.append(steps)
        return path
