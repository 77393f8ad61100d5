"""Declared dependencies are the imported ones (pyproject.toml against the import statements).

Every third-party package imported by ``gwtfp2p/`` or ``cli/`` is a runtime dependency or an
optional extra; an extra is imported only inside functions (a volunteer without it can import every
module); every runtime dependency and extra is imported somewhere; tests, benchmarks and the docker
scripts import only what ``dev`` pulls in. docker/constraints.txt pins the whole runtime closure
within the declared ranges. Import names map to distributions through the installed metadata.
"""

from __future__ import annotations

import ast
import functools
import gc
import sys
from collections import defaultdict
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("gwtfp2p", "cli")
DEV_FOLDERS = ("tests", "benchmarks", "docker")
SCRIPTS = {path.stem for folder in ("docker", "benchmarks")  # each folder's scripts import each other
           for path in (REPO / folder).glob("*.py")}
FIRST_PARTY = {"gwtfp2p", "gwtf_cli", "tests", *SCRIPTS}
DEV_ONLY_EXTRA = "dev"


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(text).name) for text in requirements
            if canonicalize_name(Requirement(text).name) != "gwtfp2p"}


def runtime() -> set[str]:
    return _names(_project()["dependencies"])


def extras() -> dict[str, set[str]]:
    return {name: _names(reqs) for name, reqs in _project().get("optional-dependencies", {}).items()}


def imports_in(folders: tuple[str, ...]) -> dict[str, dict[str, bool]]:
    """Top-level third-party module -> {file: imported when the file is imported?} under ``folders``."""
    found: dict[str, dict[str, bool]] = defaultdict(dict)
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            file = str(path.relative_to(REPO))
            for module, eager in _imports(_parse(path.read_text(), file), in_function=False):
                root = module.split(".")[0]
                if root not in sys.stdlib_module_names and root not in FIRST_PARTY:
                    found[root][file] = found[root].get(file, False) or eager
    return found


def _parse(source: str, filename: str) -> ast.Module:
    """``ast.parse`` with the garbage collector held off. On CPython 3.11 a finalizer that runs during a
    parse and formats a traceback parses again inside it (the traceback's carets), and the outer parse
    then fails: ``SystemError: AST constructor recursion depth mismatch``. The CI run at 3db0afc met it
    when asyncio logged a task exception left never retrieved by a failed try of another test."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename)
    finally:
        if enabled:
            gc.enable()


def _imports(node: ast.AST, in_function: bool) -> list[tuple[str, bool]]:
    """(module, runs on import) of every absolute import below ``node``; a function body runs later."""
    if isinstance(node, ast.Import):
        return [(alias.name, not in_function) for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [(node.module, not in_function)] if node.level == 0 and node.module else []
    inside = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    return [found for child in ast.iter_child_nodes(node) for found in _imports(child, inside)]


@functools.cache
def _providers() -> dict[str, list[str]]:
    return packages_distributions()


def distribution_of(module: str) -> str:
    """The installed distribution that provides ``module``; its own name when none is installed here
    (an import guarded by a Python version, declared with a marker)."""
    dists = _providers().get(module)
    return canonicalize_name(dists[0] if dists else module)


def test_every_package_import_is_declared_and_extras_are_imported_lazily():
    declared_extras = {name: dists for name, dists in extras().items() if name != DEV_ONLY_EXTRA}
    optional = set().union(*declared_extras.values()) if declared_extras else set()
    undeclared, eager = [], []
    for module, files in imports_in(PACKAGE_FOLDERS).items():
        dist = distribution_of(module)
        if dist in runtime():
            continue
        if dist not in optional:
            undeclared.append(f"{module} ({dist}) in {sorted(files)}")
        eager += [f"{module} at module level in {file}" for file, at_top in files.items() if at_top]
    assert not undeclared, f"imported but not declared in [project] dependencies or an extra: {undeclared}"
    assert not eager, f"an optional extra must be imported inside the function that needs it: {eager}"


def test_every_declared_dependency_and_extra_is_imported():
    imported = {distribution_of(module) for module in imports_in(PACKAGE_FOLDERS)}
    unused = sorted(runtime() - imported)
    assert not unused, f"declared in [project] dependencies but never imported by gwtfp2p/ or cli/: {unused}"
    for name, dists in extras().items():
        if name != DEV_ONLY_EXTRA:
            assert dists <= imported, f"extra [{name}] declares {sorted(dists - imported)}, never imported"


def test_tests_benchmarks_and_scripts_import_only_what_dev_installs():
    available = runtime() | set().union(*extras().values())
    missing = sorted(f"{module} ({distribution_of(module)}) in {sorted(files)}"
                     for module, files in imports_in(DEV_FOLDERS).items()
                     if distribution_of(module) not in available)
    assert not missing, f"imported by tests/benchmarks/docker scripts but not in any extra (add to dev): {missing}"


def test_the_constraints_pin_the_runtime_closure_within_the_declared_ranges():
    import importlib.util

    spec = importlib.util.spec_from_file_location("freeze_constraints", REPO / "docker" / "freeze_constraints.py")
    assert spec is not None and spec.loader is not None
    freeze = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(freeze)
    pins = {}
    for line in (REPO / "docker" / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    closure = freeze.runtime_closure(freeze.declared_requirements())
    unpinned = sorted(set(closure) - set(pins))
    assert not unpinned, f"docker/constraints.txt lacks {unpinned}: run docker/freeze_constraints.py"
    for requirement in map(Requirement, _project()["dependencies"]):
        version = pins[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(version, prereleases=True), \
            f"docker/constraints.txt pins {requirement.name}=={version}, outside {requirement}"
