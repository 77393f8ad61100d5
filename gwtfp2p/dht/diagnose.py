"""What went wrong when a node could not start or reach its initial peers, said so a user can act on it.

``diagnose_peers`` tries each initial peer's TCP address once (refused, no answer, no route, or it
answered: then it is not a libp2p peer with that id, or it refused our handshake) so the error names
the address and what was tried. ``p2pd_message`` takes p2pd's own last words out of hivemind's
``P2PDaemonError`` (a Go log line with a timestamp, or a JSON log record). Only sockets, no hivemind.
"""

from __future__ import annotations

import asyncio
import errno
import json
import re
from collections.abc import Sequence

_GO_TIMESTAMP = re.compile(r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)? ")
_TCP = re.compile(r"^/(ip4|ip6|dns4|dns6|dns)/([^/]+)/tcp/(\d+)")


def tcp_endpoint(maddr: str) -> tuple[str, int] | None:
    """(host, port) of a ``/ip4|ip6|dns*/HOST/tcp/PORT...`` multiaddr, else None."""
    match = _TCP.match(maddr)
    return (match.group(2), int(match.group(3))) if match else None


async def probe_tcp(host: str, port: int, timeout_s: float) -> str:
    """One TCP connect to ``host:port``: "open", or what happened instead (for an error message)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except asyncio.TimeoutError:
        return f"no answer within {timeout_s:.0f} s (the address is dropped by a firewall or NAT, or nobody is there)"
    except ConnectionRefusedError:
        return "connection refused (the host is up, nothing listens on that port)"
    except OSError as e:
        if e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "no route to that address (wrong address, or this machine is offline)"
        return f"cannot connect: {e.strerror or e}"
    writer.close()
    return "open"


async def diagnose_peers(maddrs: Sequence[str], timeout_s: float = 3.0) -> list[str]:
    """One line per initial peer: its address and what a TCP connect to it did."""
    async def one(maddr: str) -> str:
        endpoint = tcp_endpoint(maddr)
        if endpoint is None:
            return f"{maddr}: not a TCP address, not tried"
        outcome = await probe_tcp(*endpoint, timeout_s)
        if outcome == "open":
            outcome = ("TCP connect works, but the libp2p handshake failed: is the /p2p/ id the peer's "
                       "current one (it changes when a node restarts without --identity)?")
        return f"{endpoint[0]}:{endpoint[1]}: {outcome}"

    return list(await asyncio.gather(*(one(m) for m in maddrs)))


def p2pd_message(text: str) -> str:
    """p2pd's own message in hivemind's "Daemon failed to start: ..." (its last line of output)."""
    lines = text.strip().splitlines() or [text]
    line = next((x for x in lines if x.lstrip().startswith("panic:")), lines[-1])
    line = line.split("Daemon failed to start:", 1)[-1].strip()
    if line.startswith("{"):
        try:
            record = json.loads(line)
            line = str(record.get("msg", line)) + (f": {record['error']}" if "error" in record else "")
        except ValueError:
            pass
    return _GO_TIMESTAMP.sub("", line)
