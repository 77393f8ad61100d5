"""gwtfp2p.transport (see DESIGN.md §4 and docs/architecture.md)."""
