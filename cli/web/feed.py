"""What the live page shows, shared between the poller (writes) and the HTTP handlers (read).

The last summary (``gwtf status --json``'s object) plus a ``live`` field from the ``History``:
its version, read times, the last read error, the loss/tokens series, recent events and the
crashed nodes still marked. ``/status.json`` is that object; ``/routing.svg`` its picture. Both
are encoded once per version, under a lock; nothing here does I/O.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from gwtf_cli.web.history import History
from gwtf_cli.web.layout import layout
from gwtf_cli.web.render import to_svg

KEPT_PICTURES = 4  # versions whose picture can still be fetched (the page asks for the one it rendered)


class StatusFeed:
    def __init__(self, history: History | None = None) -> None:
        self._lock = threading.Lock()
        self._history = history or History()
        self._summary: dict[str, Any] | None = None
        self._json: tuple[int, bytes] | None = None
        self._pictures: OrderedDict[int, tuple[dict[str, Any], list[dict[str, Any]], bytes | None]] = OrderedDict()

    def update(self, summary: dict[str, Any], now_s: float) -> None:
        with self._lock:
            self._history.observe(summary, now_s)
            self._summary = summary
            self._pictures[self._history.version] = (summary, self._history.view()["gone"], None)
            while len(self._pictures) > KEPT_PICTURES:
                self._pictures.popitem(last=False)

    def fail(self, error: str, now_s: float) -> None:
        with self._lock:
            self._history.fail(error, now_s)

    @property
    def version(self) -> int:
        with self._lock:
            return self._history.version

    def status_json(self) -> tuple[bool, bytes]:
        """(whether a read succeeded yet, the JSON object): the summary with its ``live`` history."""
        with self._lock:
            version = self._history.version
            if self._json is None or self._json[0] != version:
                live = self._history.view()
                body = {**self._summary, "live": live} if self._summary is not None else {"live": live}
                self._json = (version, json.dumps(body, default=str).encode())
            return self._summary is not None, self._json[1]

    def routing_svg(self, version: int | None = None) -> bytes | None:
        """The routing picture of read ``version`` if still kept, else of the last read (crashed nodes
        marked); None before the first read. Its root's ``data-version`` says which read it shows."""
        with self._lock:
            if not self._pictures:
                return None
            if version not in self._pictures:
                version = next(reversed(self._pictures))
            summary, gone, svg = self._pictures[version]
            if svg is None:
                svg = to_svg(layout(summary, gone), version).encode()
                self._pictures[version] = (summary, gone, svg)
            return svg
