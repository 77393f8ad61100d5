"""gwtfp2p.sim (see DESIGN.md §4 and docs/architecture.md)."""
