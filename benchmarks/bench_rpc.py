"""Forward+backward RPC throughput between two processes vs raw TCP on loopback, side by side.

    .venv/bin/python benchmarks/bench_rpc.py [--size-mib 16] [--rounds 10] [--part-kib 256 1024]

A server process (started by this script in its own process group) runs a gwtf ``Transport`` and
raw TCP echoes. One round = the client sends a forward activation of ``size`` bytes; the server
acknowledges it and sends a backward gradient of the same size back; the round ends when the client
has received it. Both directions carry ``size`` bytes, so MiB/s = 2 × size / round time. Paths: gwtf
RPC over libp2p streams (through both p2pd), gwtf RPC over the direct data channel
(``transport/direct.py``), raw TCP with asyncio streams and with blocking sockets (the reference);
their rounds are interleaved, one of each in turn. Where the time goes: CPU seconds per round of
each process (client, its p2pd, server, its p2pd), from /proc. Also prints ping RTT (RPC vs TCP).
Prints figures and ratios; asserts nothing. Results: docs/transport.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import torch

from gwtfp2p.dht import route_hivemind_logs
from gwtfp2p.transport import (
    Ack,
    MicrobatchId,
    StateBlob,
    TransferMeta,
    Transport,
    TransportError,
    TransportLimits,
)
from gwtfp2p.transport.client import TransportClient

MIB = 2**20
READY_TIMEOUT_S = 60.0


# ----- server process -----

class EchoHandlers:
    """Server side: ack a forward at once, then send a same-sized backward to the sender."""

    def __init__(self) -> None:
        self.transport: Transport | None = None
        self.clients: dict[tuple[int, bool], TransportClient] = {}
        self.tasks: set[asyncio.Task] = set()

    async def _send_back(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> None:
        assert self.transport is not None
        part_bytes = int(meta.tags.get("part_bytes", self.transport.limits.part_bytes))
        direct = bool(meta.tags.get("direct", False))  # the backward takes the forward's path
        client = self.clients.setdefault((part_bytes, direct), TransportClient(
            self.transport.p2p, TransportLimits(part_bytes=part_bytes, direct_channel=direct)))
        try:
            await client.backward(sender, meta, tensor, timeout_s=60)
        except TransportError as e:  # the client may be gone already (end of the benchmark)
            logging.getLogger(__name__).debug("backward failed: %s", e)

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        task = asyncio.create_task(self._send_back(sender, meta, tensor))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return Ack()

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        return Ack(accepted=False, reason="server takes no backward")

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        return None

    async def get_state(self, stage: int) -> StateBlob | None:
        return None


async def _tcp_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            header = await reader.readexactly(8)
            data = await reader.readexactly(int.from_bytes(header, "big"))
            writer.write(header)
            writer.write(data)
            await writer.drain()
    writer.close()


def _recv_exactly(conn: socket.socket, size: int) -> bytearray | None:
    buffer = bytearray(size)
    view, received = memoryview(buffer), 0
    while received < size:
        n = conn.recv_into(view[received:])
        if n == 0:
            return None
        received += n
    return buffer


def _blocking_echo(listener: socket.socket) -> None:
    """Raw TCP with blocking sockets in a thread: the physical reference."""
    while True:
        conn, _ = listener.accept()
        with conn:
            while (header := _recv_exactly(conn, 8)) is not None:
                data = _recv_exactly(conn, int.from_bytes(header, "big"))
                if data is None:
                    break
                conn.sendall(header + data)


async def serve() -> None:
    handlers = EchoHandlers()
    handlers.transport = await Transport.standalone(handlers)
    tcp = await asyncio.start_server(_tcp_echo, "127.0.0.1", 0)
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_blocking_echo, args=(listener,), daemon=True).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"maddrs": await handlers.transport.visible_maddrs(), "peer_id": handlers.transport.peer_id,
                      "pids": {"server": os.getpid(), "server p2pd": handlers.transport.p2p._child.pid},
                      "tcp_port": tcp.sockets[0].getsockname()[1],
                      "blocking_tcp_port": listener.getsockname()[1]}), flush=True)
    await stop.wait()
    tcp.close()
    await handlers.transport.close()


# ----- client (main) process -----

class Collector:
    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future] = {}

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        return Ack(accepted=False)

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        future = self.waiting.pop(meta.microbatch.key, None)
        if future is not None and not future.done():
            future.set_result(tensor)
        return Ack()

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        return None

    async def get_state(self, stage: int) -> StateBlob | None:
        return None


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds each process used so far (its threads included), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / ticks
    return out


async def rpc_round(client: TransportClient, transport: Transport, collector: Collector, server: str,
                    tensor: torch.Tensor, index: int) -> float:
    direct = client.limits.direct_channel
    meta = TransferMeta(microbatch=MicrobatchId(data_holder=transport.peer_id, iteration=0, index=index),
                        stage=1, tags={"part_bytes": client.limits.part_bytes, "direct": direct})
    future = asyncio.get_running_loop().create_future()
    collector.waiting[meta.microbatch.key] = future
    started = time.perf_counter()
    await client.forward(server, meta, tensor, timeout_s=60)
    await asyncio.wait_for(future, 60)
    return time.perf_counter() - started


async def tcp_round(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> float:
    started = time.perf_counter()
    writer.write(len(payload).to_bytes(8, "big"))
    writer.write(payload)
    await writer.drain()
    size = int.from_bytes(await reader.readexactly(8), "big")
    await reader.readexactly(size)
    return time.perf_counter() - started


def blocking_tcp_round(conn: socket.socket, payload: bytes) -> float:
    started = time.perf_counter()
    conn.sendall(len(payload).to_bytes(8, "big") + payload)
    header = _recv_exactly(conn, 8)
    if header is None or _recv_exactly(conn, int.from_bytes(header, "big")) is None:
        raise ConnectionError("the echo server closed the connection")
    return time.perf_counter() - started


async def start_server() -> tuple[asyncio.subprocess.Process, dict]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, os.path.abspath(__file__), "--serve", stdout=asyncio.subprocess.PIPE,
        start_new_session=True)
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT_S)
    if not line:
        raise RuntimeError("the server process exited before it was ready")
    return process, json.loads(line)


def stop_server(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def _rate(size_bytes: int, seconds: list[float]) -> float:
    return 2 * size_bytes / MIB / statistics.median(seconds)


async def interleaved(paths: dict[str, Callable[[int], Awaitable[float]]], rounds: int, pids: dict[str, int],
                      size_bytes: int) -> dict:
    """Two warm-up rounds of each path (a direct connection opens during the first), then ``rounds`` rounds
    of every path in turn, so that a busy spell of the machine falls on all of them alike: MiB/s (median
    round) and each process's CPU seconds per round, by path."""
    index = 0
    for _ in range(2):
        for run in paths.values():
            index += 1
            await run(index)
    times: dict[str, list[float]] = {name: [] for name in paths}
    cpu: dict[str, dict[str, float]] = {name: dict.fromkeys(pids, 0.0) for name in paths}
    for _ in range(rounds):
        for name, run in paths.items():
            index += 1
            before = cpu_seconds(pids)
            times[name].append(await run(index))
            after = cpu_seconds(pids)
            for p in pids:
                cpu[name][p] += (after[p] - before[p]) / rounds
    results: dict = {}
    for name in paths:
        results[name] = _rate(size_bytes, times[name])
        results[f"{name}_cpu"] = cpu[name]
        results[f"{name}_round_s"] = statistics.median(times[name])
    return results


async def measure(args: argparse.Namespace) -> dict:
    size = int(args.size_mib * MIB)
    tensor = torch.randn(size // 4)
    payload = tensor.numpy().tobytes()
    process, info = await start_server()
    collector = Collector()
    transport = await Transport.standalone(collector, initial_peers=info["maddrs"])
    pids = {"client": os.getpid(), "client p2pd": transport.p2p._child.pid, **info["pids"]}
    server = info["peer_id"]
    reader, writer = await asyncio.open_connection("127.0.0.1", info["tcp_port"])
    conn = socket.create_connection(("127.0.0.1", info["blocking_tcp_port"]))
    clients = {f"rpc_{k}k": TransportClient(transport.p2p, TransportLimits(part_bytes=k * 1024, direct_channel=False))
               for k in args.part_kib}
    clients["rpc_direct"] = TransportClient(transport.p2p, TransportLimits(direct_channel=True))

    def rpc(client: TransportClient) -> Callable[[int], Awaitable[float]]:
        return lambda i: rpc_round(client, transport, collector, server, tensor, i)

    async def tcp_asyncio(_: int) -> float:
        return await tcp_round(reader, writer, payload)

    async def tcp_blocking(_: int) -> float:
        return blocking_tcp_round(conn, payload)

    try:
        paths = {name: rpc(client) for name, client in clients.items()}
        paths.update(tcp_asyncio=tcp_asyncio, tcp=tcp_blocking)
        results = await interleaved(paths, args.rounds, pids, size)
        pings = [(await transport.ping(server, timeout_s=5)).rtt_s for _ in range(args.pings)]
        results["rpc_ping_ms"] = 1000 * statistics.median(pings)
        results["tcp_ping_ms"] = 1000 * statistics.median(
            [await tcp_round(reader, writer, b"x") for _ in range(args.pings)])
    finally:
        writer.close()
        conn.close()
        for client in clients.values():
            if client.direct is not None:
                await client.direct.close()
        await transport.close()
        stop_server(process)
        await process.wait()
    return results


def report(args: argparse.Namespace, results: dict) -> None:
    print(f"forward+backward of a {args.size_mib:g} MiB float32 activation, two processes, loopback, "
          f"median of {args.rounds} rounds (MiB/s = 2 x size / round time); CPU ms per round by process")
    rows = [(f"gwtf RPC, libp2p, {k} KiB parts", f"rpc_{k}k") for k in args.part_kib]
    rows += [("gwtf RPC, direct channel", "rpc_direct"), ("raw TCP, asyncio streams", "tcp_asyncio"),
             ("raw TCP, blocking sockets", "tcp")]
    names = list(results["tcp_cpu"])
    print(f"{'path':<32}{'MiB/s':>8}{'vs raw TCP':>12}" + "".join(f"{n:>14}" for n in names))
    for label, key in rows:
        cpu = results[f"{key}_cpu"]
        print(f"{label:<32}{results[key]:>8.1f}{results[key] / results['tcp']:>12.3f}"
              + "".join(f"{1000 * cpu[n]:>14.0f}" for n in names))
    print(f"ping RTT median of {args.pings}: RPC {results['rpc_ping_ms']:.2f} ms, "
          f"raw TCP {results['tcp_ping_ms']:.3f} ms")
    if args.json:
        print(json.dumps(results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--size-mib", type=float, default=16.0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--pings", type=int, default=50)
    parser.add_argument("--part-kib", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--json", action="store_true", help="also print the raw figures as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("GWTF_BENCH_LOG_LEVEL", "WARNING").upper(),
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    route_hivemind_logs()
    if args.serve:
        asyncio.run(serve())
        return
    report(args, asyncio.run(measure(args)))


if __name__ == "__main__":
    main()
