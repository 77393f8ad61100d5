"""gwtfp2p.daemon (see DESIGN.md §4 and docs/architecture.md)."""
