"""The live page's HTTP server (standard library) and the poller that keeps its data fresh.

``serve_status(read_summary, port)`` starts two threads: a ``ThreadingHTTPServer`` serving the page
(``/``, ``/app.js``, ``/style.css`` from the package), ``/status.json`` (``?since=V``: 204 while the
version is still V) and ``/routing.svg`` (``?v=V``: the picture of read V, if still kept); and a
poller calling ``read_summary()`` every ``interval_s`` (it must bound its own wait: the DHT reader
does) and feeding the result to a ``StatusFeed``. ``gwtf status --serve`` and ``gwtf demo --serve``
both use it; ``StatusHandle.close`` stops both threads with deadlines.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from gwtf_cli.web.feed import StatusFeed

logger = logging.getLogger(__name__)

INTERVAL_S = 2.0  # between the starts of two reads of the swarm
REQUEST_TIMEOUT_S = 10.0  # a client that sends nothing for this long is dropped
CLOSE_TIMEOUT_S = 20.0  # how long ``close`` waits for a read in progress
HTML = "text/html; charset=utf-8"
STATIC = {"/": ("index.html", HTML), "/index.html": ("index.html", HTML),
          "/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/style.css": ("style.css", "text/css; charset=utf-8")}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


def _static_files() -> dict[str, bytes]:
    folder = resources.files("gwtf_cli.web").joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name, _ in STATIC.values()}


def _version_param(query: str, name: str) -> int | None:
    """``name=N`` of a query string, as a version number (None when absent or not a small integer)."""
    for value in parse_qs(query, max_num_fields=4).get(name, [])[:1]:
        if value.isdigit() and len(value) < 16:
            return int(value)
    return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], feed: StatusFeed) -> None:
        self.feed = feed
        self.files = _static_files()
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        feed = self.server.feed
        if path in STATIC:
            name, content_type = STATIC[path]
            self._send(HTTPStatus.OK, content_type, self.server.files[name])
        elif path == "/status.json":
            since = _version_param(query, "since")
            if since is not None and since == feed.version:
                self._send(HTTPStatus.NO_CONTENT, "application/json", b"")  # nothing new since the page's last
                return
            ready, body = feed.status_json()
            self._send(HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE, "application/json", body)
        elif path == "/routing.svg":
            svg = feed.routing_svg(_version_param(query, "v"))
            if svg is None:
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", b"no read of the swarm yet\n")
            else:
                self._send(HTTPStatus.OK, "image/svg+xml", svg)
        else:
            self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class StatusHandle:
    """A running page: its ``url``, the ``feed`` it shows; ``close()`` stops the server and the poller."""

    def __init__(self, server: _Server, feed: StatusFeed, read_summary: Callable[[], dict[str, Any]],
                 interval_s: float, clock: Callable[[], float]) -> None:
        self.feed = feed
        self._server = server
        self._read = read_summary
        self._interval_s = interval_s
        self._clock = clock
        self._stop = threading.Event()
        host, port = server.server_address[:2]
        self.port = int(port)
        self.url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}/"
        self._serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                         name="gwtf-status-http", daemon=True)
        self._polling = threading.Thread(target=self._poll, name="gwtf-status-poll", daemon=True)

    def start(self) -> StatusHandle:
        self._serving.start()
        self._polling.start()
        return self

    def _poll(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                summary = self._read()
            except Exception as e:  # any failed read is shown on the page; the next one may succeed
                logger.warning("reading the swarm failed: %s", e)
                self.feed.fail(str(e) or type(e).__name__, self._clock())
            else:
                self.feed.update(summary, self._clock())
            self._stop.wait(max(0.0, self._interval_s - (time.monotonic() - started)))

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Stop serving and polling; False if a read in progress outlived ``timeout_s``."""
        self._stop.set()
        if self._serving.is_alive():
            self._server.shutdown()
        self._server.server_close()
        self._serving.join(timeout_s)
        self._polling.join(timeout_s)
        return not self._polling.is_alive()


def serve_status(read_summary: Callable[[], dict[str, Any]], port: int = 0, *, host: str = "127.0.0.1",
                 interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.time) -> StatusHandle:
    """Serve the live page on ``host:port`` (0: any free port, see ``handle.url``), reading the swarm with
    ``read_summary`` (returns a ``gwtf status --json`` object; raises on a failed read) every ``interval_s``.
    ``OSError`` if the port cannot be bound."""
    if interval_s <= 0:
        raise ValueError(f"--interval-s must be > 0, got {interval_s}")
    feed = StatusFeed()
    return StatusHandle(_Server((host, port), feed), feed, read_summary, interval_s, clock).start()
