"""Test tooling: a daemon enters a Linux network namespace named by ``$GWTF_NETNS`` before it opens anything.

Integration tests of NATs, relays and outages run each node in its own namespace (``ip netns add``),
wired by veth pairs and an iptables NAT router (``tests/integration/netns``). Local swarms fork their
daemons from one preloaded zygote in the root namespace; a daemon started with ``$GWTF_NETNS=NAME``
switches its network namespace to ``/run/netns/NAME`` first thing (``setns``, while it still has a
single thread: the DHT process and p2pd it starts later inherit the namespace). Off unless the
variable is set; needs CAP_SYS_ADMIN (root). No effect on anything else.
"""

from __future__ import annotations

import ctypes
import os
import threading

NETNS_ENV = "GWTF_NETNS"
NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """The namespace named by ``$GWTF_NETNS`` could not be entered."""


def enter_from_env() -> str | None:
    """Enter ``$GWTF_NETNS`` if set (once, single-threaded); the namespace's name, or None."""
    name = os.environ.get(NETNS_ENV, "").strip()
    if not name:
        return None
    if "/" in name or name in (".", ".."):
        raise NetnsError(f"${NETNS_ENV}: {name!r} is not a namespace name")
    if threading.active_count() != 1:
        raise NetnsError(f"${NETNS_ENV}: a namespace can only be entered before any thread starts")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise NetnsError(f"${NETNS_ENV}: setns({name}) failed: {os.strerror(error)}")
    finally:
        os.close(fd)
    os.environ.pop(NETNS_ENV)  # children already inherit the namespace itself
    return name
