"""gwtfp2p.model (see DESIGN.md §4 and docs/architecture.md)."""
