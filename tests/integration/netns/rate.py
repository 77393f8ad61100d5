"""What a shaped link really carries: one raw TCP transfer between two hosts of a ``Topology``, timed.

``tc tbf`` caps a host's uplink in the kernel (``Topology.shape``); ``transfer_mbit`` sends ``size_bytes``
from one host to another over plain TCP (a Python one-liner in each namespace) and returns the Mbit/s the
receiver saw, so tests and benchmarks check the cap instead of trusting it. ``tx_bytes`` reads what a
host's link has sent in all (the kernel's counter: headers, framing and every protocol included).
"""

from __future__ import annotations

import subprocess
import sys

from tests.integration.netns.topology import Topology

PORT = 5216
_SERVE = ("import socket, sys, time\n"
          "s = socket.create_server((sys.argv[1], int(sys.argv[2]))); print('ready', flush=True)\n"
          "c, _ = s.accept(); n, t = 0, None\n"
          "while (k := len(c.recv(1 << 20))):\n"
          "    t = t or time.monotonic(); n += k\n"
          "c.sendall(b'.'); print(n, time.monotonic() - t, flush=True)\n")
_SEND = ("import socket, sys\n"
         "c = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
         "c.sendall(b'x' * int(sys.argv[3])); c.shutdown(socket.SHUT_WR); c.recv(1)\n")


def transfer_mbit(topo: Topology, sender: str, receiver: str, size_bytes: int = 4 * 2**20,
                  timeout_s: float = 120.0) -> float:
    """Mbit/s of one TCP transfer of ``size_bytes`` from host ``sender`` to host ``receiver``, timed by the
    receiver from its first byte to its last."""
    host = topo.hosts[receiver]
    server = subprocess.Popen(host.exec_args(sys.executable, "-c", _SERVE, host.address, str(PORT)),
                              stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout is None or server.stdout.readline().strip() != "ready":
            raise RuntimeError("the receiving end did not start")
        subprocess.run(topo.hosts[sender].exec_args(sys.executable, "-c", _SEND, host.address, str(PORT),
                                                    str(size_bytes)), check=True, timeout=timeout_s)
        received, seconds = server.stdout.readline().split()
        if int(received) != size_bytes:
            raise RuntimeError(f"{received} of {size_bytes} bytes arrived")
        return size_bytes * 8 / 1e6 / float(seconds)
    finally:
        server.kill()
        server.wait()


def tx_bytes(topo: Topology, name: str) -> int:
    """Bytes host ``name``'s link has sent since it was made (``/sys/class/net/<link>/statistics/tx_bytes``)."""
    host = topo.hosts[name]
    return int(host.run("cat", f"/sys/class/net/{host.link}/statistics/tx_bytes").stdout)
