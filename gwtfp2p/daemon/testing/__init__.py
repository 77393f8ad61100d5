"""Test tooling inside the daemon: crash points and delay points, armed only by environment variables."""
