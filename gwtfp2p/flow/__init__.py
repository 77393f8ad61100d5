"""gwtfp2p.flow (see docs/architecture.md)."""
