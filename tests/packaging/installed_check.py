"""Run by test_wheel.py with the clean venv's Python: import every module of the installed packages.

Prints one JSON object: the modules imported, the failures (module -> error), where each top-level
package was imported from, and which optional packages are installed. Run as a script with ``-I``
(isolated: neither the repository nor PYTHONPATH on sys.path), so only the wheel can answer.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
import sys
import traceback

PACKAGES = ("gwtfp2p", "gwtf_cli")
OPTIONAL = ("matplotlib",)


def main() -> int:
    imported: list[str] = []
    failures: dict[str, str] = {}
    origins: dict[str, str] = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        origins[name] = package.__file__ or ""
        imported.append(name)

        def failed(module: str) -> None:
            failures[module] = traceback.format_exc(limit=3)

        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}.", onerror=failed):
            try:
                importlib.import_module(info.name)
            except Exception:  # every failure is reported, none stops the walk
                failures[info.name] = traceback.format_exc(limit=3)
            else:
                imported.append(info.name)
    print(json.dumps({"imported": imported, "failures": failures, "origins": origins, "prefix": sys.prefix,
                      "optional_installed": [m for m in OPTIONAL if importlib.util.find_spec(m) is not None]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
