"""The ``gwtf`` command line (typer), installed under the import name ``gwtf_cli``."""
