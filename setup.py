"""Package discovery for setuptools: every package and data folder under ``gwtfp2p/`` and ``cli/``.

pyproject.toml holds the metadata; this file only exists because the CLI's import name
(``gwtf_cli``) differs from its folder (``cli/``), which ``[tool.setuptools.packages.find]`` cannot
express. Folders are found as namespace packages, so data-only folders (``gwtfp2p/data``, static
web assets) are packages too and MANIFEST.in's files in them ship as package data.
"""

from setuptools import find_namespace_packages, setup

PACKAGE_DIRS = {"gwtfp2p": "gwtfp2p", "gwtf_cli": "cli"}
NOT_PACKAGES = ["__pycache__", "*.__pycache__"]


def packages_in(name: str, folder: str) -> list[str]:
    """``name`` and every folder below ``folder`` as a dotted package name under ``name``."""
    return [name] + [f"{name}.{sub}" for sub in find_namespace_packages(where=folder, exclude=NOT_PACKAGES)]


setup(
    package_dir=PACKAGE_DIRS,
    packages=[package for name, folder in PACKAGE_DIRS.items() for package in packages_in(name, folder)],
)
