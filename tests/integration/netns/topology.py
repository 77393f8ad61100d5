"""A small internet on one machine: network namespaces, veth pairs, a bridge, an iptables NAT router.

``Topology`` (a context manager) creates, under a prefix unique to this test run, a ``wan`` namespace
with a bridge (the internet's switch), *public* hosts on it (one address each) and *home* hosts behind
a NAT router: the router's WAN side is on the bridge, its LAN side on a veth to the home host, and it
MASQUERADEs what leaves the LAN and drops every connection that starts on the WAN side (the home host
accepts nothing unsolicited, as behind a home router without port forwarding). ``link_down`` and
``link_up`` cut a host's only link; ``shape`` caps a link with ``tc tbf``. Everything is removed at the
end, on failure too: deleting a namespace removes its veths, routes and iptables rules. Needs root;
a topology that cannot be built raises, so the test fails (it never skips).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field

WAN_NET = "10.77.0"  # public hosts and routers' WAN sides: 10.77.0.X/24
# Prefix families of the project's topologies (tests: g13, bench_bandwidth: bw16, bench_nat: nat13), each
# followed by a random hex suffix: a namespace of one of them with no process in it is a killed run's leftover.
STALE_NAME = re.compile(r"^(g13|bw16|nat13)[0-9a-f]+-.+$")
LAN_NET = "192.168.{}"  # home network behind router k: 192.168.(100+k).0/24


class TopologyError(RuntimeError):
    """A namespace, link or rule could not be created (the message has the command and its error)."""


def sh(*args: str, check: bool = True, timeout_s: float = 20.0) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if check and done.returncode != 0:
        raise TopologyError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def clear_stale() -> list[str]:
    """Delete the namespaces a killed run of ours left (our prefix families, no process inside); the names."""
    listed = sh("ip", "netns", "list", check=False).stdout.split("\n")
    stale = [name for name in (line.split(" ", 1)[0] for line in listed)
             if STALE_NAME.match(name) and not sh("ip", "netns", "pids", name, check=False).stdout.strip()]
    for name in stale:
        sh("ip", "netns", "del", name, check=False)
    return stale


@dataclass
class Host:
    """One namespace with one link: its name, its address, and how to run a command in it."""

    netns: str
    address: str
    link: str  # the interface name inside the namespace
    behind_nat: bool = False
    router_wan: str = ""  # behind a NAT: the router's public address (what peers see)
    downlink: tuple[str, str] = ("", "")  # (namespace, interface) whose egress is what this host receives

    def exec_args(self, *command: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *command]

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess:
        return sh(*self.exec_args(*command), check=check)


@dataclass
class Topology:
    prefix: str = field(default_factory=lambda: f"g13{uuid.uuid4().hex[:5]}")
    namespaces: list[str] = field(default_factory=list)
    hosts: dict[str, Host] = field(default_factory=dict)
    _next_ip: int = 10
    _routers: int = 0
    _ports: dict[str, str] = field(default_factory=dict)

    def __enter__(self) -> Topology:
        clear_stale()
        atexit.register(self.close)
        self._namespace("wan")
        self._in("wan", "ip", "link", "add", "br0", "type", "bridge")
        self._in("wan", "ip", "link", "set", "br0", "up")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- building -------------------------------------------------------------------------------
    def _ns(self, short: str) -> str:
        return f"{self.prefix}-{short}"

    def _in(self, short: str, *command: str) -> None:
        sh("ip", "netns", "exec", self._ns(short), *command)

    def _namespace(self, short: str) -> str:
        name = self._ns(short)
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        self._in(short, "ip", "link", "set", "lo", "up")
        return name

    def _veth(self, a_short: str, a_if: str, b_short: str, b_if: str) -> None:
        """A veth pair between two namespaces (created with unique temporary names, then renamed)."""
        tmp_a, tmp_b = f"v{uuid.uuid4().hex[:10]}", f"v{uuid.uuid4().hex[:10]}"
        sh("ip", "link", "add", tmp_a, "netns", self._ns(a_short), "type", "veth", "peer", "name", tmp_b,
           "netns", self._ns(b_short))
        self._in(a_short, "ip", "link", "set", tmp_a, "name", a_if)
        self._in(b_short, "ip", "link", "set", tmp_b, "name", b_if)
        self._in(a_short, "ip", "link", "set", a_if, "up")
        self._in(b_short, "ip", "link", "set", b_if, "up")

    def _on_wan(self, short: str) -> str:
        """Plug ``short`` into the WAN bridge; its WAN address (its bridge port: ``self._port[short]``)."""
        address = f"{WAN_NET}.{self._next_ip}"
        self._next_ip += 1
        port = f"p{len(self.namespaces)}{uuid.uuid4().hex[:6]}"
        self._veth(short, "eth0", "wan", port)
        self._in("wan", "ip", "link", "set", port, "master", "br0")
        self._in(short, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        self._ports[short] = port
        return address

    def public_host(self, short: str) -> Host:
        """A host on the internet: reachable by everyone at its address."""
        self._namespace(short)
        address = self._on_wan(short)
        host = Host(self._ns(short), address, "eth0", downlink=(self._ns("wan"), self._ports[short]))
        self.hosts[short] = host
        return host

    def home_host(self, short: str) -> Host:
        """A host behind its own NAT router (MASQUERADE out, nothing in): it can dial out, nobody can dial it."""
        self._routers += 1
        router, lan = f"{short}-rt", LAN_NET.format(100 + self._routers)
        self._namespace(router)
        wan_ip = self._on_wan(router)
        self._namespace(short)
        self._veth(short, "eth0", router, "lan0")
        self._in(router, "ip", "addr", "add", f"{lan}.1/24", "dev", "lan0")
        self._in(short, "ip", "addr", "add", f"{lan}.2/24", "dev", "eth0")
        self._in(short, "ip", "route", "add", "default", "via", f"{lan}.1")
        self._in(router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._in(router, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE")
        self._in(router, "iptables", "-A", "FORWARD", "-i", "eth0", "-o", "lan0", "-m", "conntrack",
                 "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        self._in(router, "iptables", "-A", "FORWARD", "-i", "eth0", "-o", "lan0", "-j", "DROP")
        host = Host(self._ns(short), f"{lan}.2", "eth0", behind_nat=True, router_wan=wan_ip,
                    downlink=(self._ns(router), "lan0"))
        self.hosts[short] = host
        return host

    # -- events ---------------------------------------------------------------------------------
    def link_down(self, short: str) -> None:
        self._in(short, "ip", "link", "set", self.hosts[short].link, "down")

    def link_up(self, short: str) -> None:
        host = self.hosts[short]
        self._in(short, "ip", "link", "set", host.link, "up")
        if host.behind_nat:  # the default route went with the link
            router_lan = host.address.rsplit(".", 1)[0] + ".1"
            sh(*host.exec_args("ip", "route", "replace", "default", "via", router_lan))

    def shape(self, short: str, rate: str, burst: str = "64kb", latency: str = "50ms") -> None:
        """Cap what ``short`` sends on its link with a token bucket (``tc tbf``)."""
        self._in(short, "tc", "qdisc", "replace", "dev", self.hosts[short].link, "root", "tbf", "rate", rate,
                 "burst", burst, "latency", latency)

    def shape_downlink(self, short: str, rate: str, burst: str = "64kb", latency: str = "50ms") -> None:
        """Cap what ``short`` receives (the egress of the interface that feeds its link) with ``tc tbf``."""
        netns, link = self.hosts[short].downlink
        sh("ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", link, "root", "tbf", "rate", rate,
           "burst", burst, "latency", latency)

    def close(self) -> None:
        for name in reversed(self.namespaces):
            with contextlib.suppress(Exception):
                for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
                sh("ip", "netns", "del", name, check=False)
        self.namespaces.clear()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
