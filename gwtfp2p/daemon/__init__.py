"""gwtfp2p.daemon: one volunteer node's life and the iteration protocol (docs/daemon.md, docs/architecture.md).

Subpackages, in the order a node builds them: ``swarm`` (the DHT view, the one failure detector, links
and transfers, the flow driver, placement), ``aggregation`` (membership, replica agreement and step,
joining, checkpoints), ``datapath`` (the receive side, the outbox and recovery, relay and data-holder
work, the iteration driver), ``lifecycle`` (start, serve, leave, shut down; the RPC inbox).
Beside them: ``config`` (every setting), ``timeouts`` (every deadline), ``wire`` (every message),
``testing`` (crash and delay points for tests). ``lifecycle.node.run_node`` is what ``gwtf join`` runs.
"""
