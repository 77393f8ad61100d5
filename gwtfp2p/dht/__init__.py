"""gwtfp2p.dht (see DESIGN.md §4 and docs/architecture.md)."""
