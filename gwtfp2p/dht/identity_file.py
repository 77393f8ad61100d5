"""Where a node's identity key lives by default, so a restarted volunteer keeps its peer id.

Without ``--identity`` a node uses ``$XDG_DATA_HOME/gwtf/identity.key`` (``~/.local/share/gwtf/...``
when the variable is unset): the directory is created 0700 and the key 0600 (a libp2p RSA key, as
hivemind writes them). A running node holds an advisory lock on ``identity.key.lock`` for its whole
life; a second node on the same machine (a local swarm, two GPUs) then gets a fresh key in a
temporary file instead, with a warning, rather than the "identity already taken" error two nodes
with one key would meet. No network, no hivemind.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gwtfp2p.dht.identity import NodeKey

logger = logging.getLogger(__name__)
KEY_NAME = "identity.key"


def data_dir(environ: dict[str, str] | None = None) -> Path:
    """The user's data directory for gwtf (XDG base directory spec)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or os.path.join(env.get("HOME") or str(Path.home()), ".local", "share")
    return Path(base) / "gwtf"


def default_identity_path(environ: dict[str, str] | None = None) -> Path:
    return data_dir(environ) / KEY_NAME


def write_new_key(path: Path) -> None:
    """A fresh RSA key at ``path``, created 0600 (never readable by others, not even briefly)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(NodeKey.generate("rsa").private_proto())


@dataclass
class IdentityFile:
    """The key file a node starts p2pd with, and what holds it: our lock, or a temporary directory."""

    path: str
    persistent: bool  # False: a fresh key for this run only
    _lock_fd: int | None = None
    _scratch: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def _ephemeral(reason: str) -> IdentityFile:
    scratch = tempfile.TemporaryDirectory(prefix="gwtf-identity-")
    path = Path(scratch.name) / KEY_NAME
    write_new_key(path)
    logger.warning("%s: this node gets a new peer id for this run only (give --identity FILE for a stable one)",
                   reason)
    return IdentityFile(str(path), persistent=False, _scratch=scratch)


def open_default_identity(environ: dict[str, str] | None = None) -> IdentityFile:
    """The default key file, created if missing and locked for this process; a temporary one if
    another running node holds it or the data directory is not writable."""
    path = default_identity_path(environ)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        return _ephemeral(f"cannot use {path} ({e.strerror})")
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        return _ephemeral(f"another gwtf node on this machine uses {path}")
    try:
        if not path.exists():
            write_new_key(path)
            logger.info("created this node's identity key %s", path)
        elif path.stat().st_mode & 0o077:
            logger.warning("identity key %s is readable by other users; chmod 600 it", path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.close(lock_fd)
        return _ephemeral(f"cannot create {path} ({e.strerror})")
    return IdentityFile(str(path), persistent=True, _lock_fd=lock_fd)
