"""gwtfp2p.sim (see docs/architecture.md)."""
