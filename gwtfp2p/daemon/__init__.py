"""gwtfp2p.daemon: one node's life (DHT → P2P → model part → serve → leave) and the iteration protocol.

``node.run_node(config, events)`` is the entry point the CLI calls on its uvloop; see docs/daemon.md.
"""
