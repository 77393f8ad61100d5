"""Events a node reports to whoever runs it (the CLI prints them; tests and the demo parse them).

Every event is a flat JSON-able dict with an ``event`` name and a ``time`` (wall clock). Names:
``startup`` (a start-up phase done), ``ready`` (peer id, addresses, stage), ``progress`` (periodic
counters, flow neighbours), ``iteration`` (a data holder closed an iteration: losses, tokens/s),
``step`` (a part took its aggregation step: hash), ``waiting`` (why nothing moves), ``leaving`` and
``stopped``. Besides the sink, listeners (the metrics) hear them. The daemon never prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Event = dict[str, Any]
EventSink = Callable[[Event], None]


def discard(_event: Event) -> None:
    """An event sink that drops everything."""


class Events:
    """Stamps and forwards events to a sink, then to its listeners; remembers the last one of each kind."""

    def __init__(self, sink: EventSink | None = None) -> None:
        self._sink = sink or discard
        self._listeners: list[EventSink] = []
        self.last: dict[str, Event] = {}

    def listen(self, listener: EventSink) -> None:
        """Also hand every later event to ``listener`` (e.g. the metrics); it must not raise."""
        self._listeners.append(listener)

    def emit(self, name: str, **fields: Any) -> None:
        event = {"event": name, "time": time.time(), **fields}
        self.last[name] = event
        self._sink(event)
        for listener in self._listeners:
            listener(event)
