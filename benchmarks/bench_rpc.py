"""Forward+backward RPC throughput between two processes vs raw TCP on loopback, side by side.

    .venv/bin/python benchmarks/bench_rpc.py [--size-mib 16] [--rounds 6] [--part-kib 256 1024 2048]

A server process (started by this script in its own process group) runs a gwtf ``Transport`` and a
raw asyncio TCP echo. One round = the client sends a forward activation of ``size`` bytes; the
server acknowledges it and sends a backward gradient of the same size back; the round ends when the
client has received it. Both directions carry ``size`` bytes, so MiB/s = 2 × size / round time.
Raw TCP does the same exchange over one plain socket. Also prints ping RTT (RPC vs TCP).
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
        self.clients: dict[int, TransportClient] = {}
        self.tasks: set[asyncio.Task] = set()

    async def _send_back(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> None:
        assert self.transport is not None
        part_bytes = int(meta.tags.get("part_bytes", self.transport.limits.part_bytes))
        client = self.clients.setdefault(part_bytes, TransportClient(
            self.transport.p2p, TransportLimits(part_bytes=part_bytes)))
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


async def rpc_round(transport: Transport, collector: Collector, server: str, tensor: torch.Tensor,
                    index: int, part_bytes: int) -> float:
    meta = TransferMeta(microbatch=MicrobatchId(data_holder=transport.peer_id, iteration=0, index=index),
                        stage=1, tags={"part_bytes": part_bytes})
    future = asyncio.get_running_loop().create_future()
    collector.waiting[meta.microbatch.key] = future
    client = TransportClient(transport.p2p, TransportLimits(part_bytes=part_bytes))
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


async def measure(args: argparse.Namespace) -> dict[str, float]:
    size = int(args.size_mib * MIB)
    tensor = torch.randn(size // 4)
    process, info = await start_server()
    collector = Collector()
    transport = await Transport.standalone(collector, initial_peers=info["maddrs"])
    results: dict[str, float] = {}
    try:
        server, index = info["peer_id"], 0
        for part_kib in args.part_kib:
            times = []
            for round_no in range(args.rounds + 1):  # first round warms up
                index += 1
                elapsed = await rpc_round(transport, collector, server, tensor, index, part_kib * 1024)
                times.append(elapsed) if round_no else None
            results[f"rpc_{part_kib}k"] = _rate(size, times)
        reader, writer = await asyncio.open_connection("127.0.0.1", info["tcp_port"])
        payload = tensor.numpy().tobytes()
        tcp_times = [await tcp_round(reader, writer, payload) for _ in range(args.rounds + 1)][1:]
        results["tcp_asyncio"] = _rate(size, tcp_times)
        with socket.create_connection(("127.0.0.1", info["blocking_tcp_port"])) as conn:
            results["tcp"] = _rate(size, [blocking_tcp_round(conn, payload) for _ in range(args.rounds + 1)][1:])
        pings = [(await transport.ping(server, timeout_s=5)).rtt_s for _ in range(args.pings)]
        results["rpc_ping_ms"] = 1000 * statistics.median(pings)
        results["tcp_ping_ms"] = 1000 * statistics.median(
            [await tcp_round(reader, writer, b"x") for _ in range(args.pings)])
        writer.close()
    finally:
        await transport.close()
        stop_server(process)
        await process.wait()
    return results


def report(args: argparse.Namespace, results: dict[str, float]) -> None:
    print(f"forward+backward of a {args.size_mib:g} MiB float32 activation, two processes, loopback, "
          f"median of {args.rounds} rounds (MiB/s = 2 x size / round time)")
    print(f"{'path':<28}{'MiB/s':>10}{'vs raw TCP':>12}")
    for part_kib in args.part_kib:
        rate = results[f"rpc_{part_kib}k"]
        print(f"{f'gwtf RPC, {part_kib} KiB parts':<28}{rate:>10.1f}{rate / results['tcp']:>12.3f}")
    print(f"{'raw TCP, asyncio streams':<28}{results['tcp_asyncio']:>10.1f}"
          f"{results['tcp_asyncio'] / results['tcp']:>12.3f}")
    print(f"{'raw TCP, blocking sockets':<28}{results['tcp']:>10.1f}{1.0:>12.3f}")
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
    parser.add_argument("--part-kib", type=int, nargs="+", default=[64, 256, 1024, 2048])
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
