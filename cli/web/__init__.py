"""``gwtf status --serve`` and the routing picture: a live web page of the swarm from the DHT's view.

``history`` derives events and time series from successive status reads, ``layout`` places the
routing graph and ``render`` paints it as SVG or PNG, ``feed`` holds what the page shows, ``server``
serves the page and ``/status.json`` (standard library only) while a poller reads the swarm.
"""

from gwtf_cli.web.server import StatusHandle, serve_status

__all__ = ["StatusHandle", "serve_status"]
