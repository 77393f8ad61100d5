"""gwtfp2p.flow (see DESIGN.md §4 and docs/architecture.md)."""
