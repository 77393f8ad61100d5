"""Typed errors of the DHT layer, each with a message a user can act on.

The CLI turns them into one-line errors; the daemon catches ``DHTError`` around every DHT call.
"""

from __future__ import annotations


class DHTError(RuntimeError):
    """Base class of every error raised by ``gwtfp2p.dht``."""


class BootstrapError(DHTError):
    """None of the initial peers could be reached (or they are not gwtf/hivemind DHT peers)."""


class DHTStartError(DHTError):
    """The local DHT could not start (port taken, bad address, identity in use, ...)."""


class DHTTimeout(DHTError):
    """A DHT operation did not finish before its deadline."""


class DHTClosed(DHTError):
    """The DHT was shut down (or its process died) before or during the call."""
