"""The Prometheus endpoint of a node: ``GET /metrics`` on the node's own event loop, bounded by deadlines.

``MetricsEndpoint.start(host, port, registry)`` listens with asyncio, not in a thread, so the
collectors read the components on the loop that changes them. Each connection gets one answer: the
request head must arrive and fit in ``MAX_REQUEST_BYTES``, and the answer be written, within
``request_timeout_s``; then it is closed. At most ``MAX_CONNECTIONS`` are served at once (more are
closed at once). The text or OpenMetrics format follows the ``Accept`` header (prometheus-client's
``choose_encoder``). ``close`` stops listening and drops the connections still open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from http import HTTPStatus

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from gwtfp2p.config import ConfigError

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0  # to read a request and write its answer
MAX_REQUEST_BYTES = 8192  # a request head longer than this is dropped
MAX_CONNECTIONS = 16
TEXT = "text/plain; charset=utf-8"


class MetricsEndpoint:
    """A listening ``/metrics`` endpoint (``port``: the one bound); ``close`` stops it."""

    def __init__(self, registry: CollectorRegistry, request_timeout_s: float) -> None:
        self.registry = registry
        self.request_timeout_s = request_timeout_s
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()

    @classmethod
    async def start(cls, host: str, port: int, registry: CollectorRegistry, *,
                    request_timeout_s: float = REQUEST_TIMEOUT_S) -> MetricsEndpoint:
        """Listen on ``host:port`` (0: any free port); ``ConfigError`` naming ``--metrics-port`` if it cannot."""
        endpoint = cls(registry, request_timeout_s)
        try:
            endpoint._server = await asyncio.start_server(endpoint._serve, host, port, limit=MAX_REQUEST_BYTES)
        except OSError as e:
            raise ConfigError(f"--metrics-port {port}: cannot listen on {host}:{port} ({e.strerror or e}); pick "
                              f"another --metrics-port or stop the program using it") from None
        endpoint.port = int(endpoint._server.sockets[0].getsockname()[1])
        logger.info("metrics at http://%s:%d/metrics", host, endpoint.port)
        return endpoint

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def answer(self, method: str, target: str, accept: str) -> tuple[HTTPStatus, str, bytes]:
        """(status, content type, body) for one request."""
        path = target.partition("?")[0]
        if path != "/metrics":
            return HTTPStatus.NOT_FOUND, TEXT, b"not found: the metrics are at /metrics\n"
        if method != "GET":
            return HTTPStatus.METHOD_NOT_ALLOWED, TEXT, b"use GET\n"
        encode, content_type = choose_encoder(accept)
        return HTTPStatus.OK, content_type, encode(self.registry)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._connections) >= MAX_CONNECTIONS or task is None:
            writer.close()
            return
        self._connections.add(task)
        try:
            await asyncio.wait_for(self._exchange(reader, writer), self.request_timeout_s)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                UnicodeDecodeError, ValueError) as e:
            logger.debug("metrics request dropped: %s", type(e).__name__)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        request_line, *header_lines = head.split("\r\n")
        method, target, _version = request_line.split(" ", 2)
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in header_lines if line)}
        status, content_type, body = self.answer(method, target, headers.get("accept", ""))
        writer.write(f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: {content_type}\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
                     .encode("latin-1") + body)
        await writer.drain()

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._server = None
