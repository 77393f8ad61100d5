"""The wheel as a volunteer gets it: built from the sources, installed into a clean venv, used.

Builds the wheel (pip's isolated build, as ``pip install .`` does) from a copy of the packaging
files and the two package folders, installs it without extras into a fresh venv with the tested
versions (docker/constraints.txt), then, from outside the repository: every module of the installed
``gwtfp2p`` and ``gwtf_cli`` imports, ``gwtf --help`` runs, and ``gwtf flow solve`` reads the
packaged geo10 data. Every file of the package folders must be in the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = {"gwtfp2p": "gwtfp2p", "cli": "gwtf_cli"}  # source folder -> installed name
BUILD_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")
CONSTRAINTS = REPO / "docker" / "constraints.txt"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
PIP_TIMEOUT_S = 420
SCRATCH_MIN_FREE_BYTES = 6 * 2**30

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    python: Path
    bin: Path
    workdir: Path  # outside the repository: the sources cannot shadow the installed packages

    def run(self, *args: str | Path, timeout_s: float = 120) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        return subprocess.run([str(a) for a in args], cwd=self.workdir, env=env, capture_output=True, text=True,
                              timeout=timeout_s)


def _pip(*args: str | Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *map(str, args)], capture_output=True, text=True,
                            timeout=PIP_TIMEOUT_S)
    assert result.returncode == 0, f"pip {' '.join(map(str, args))} failed:\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"


def source_files() -> set[str]:
    """Every file of the package folders as it should sit in the wheel (cli/ installs as gwtf_cli/)."""
    names = set()
    for folder, installed in PACKAGE_FOLDERS.items():
        for path in (REPO / folder).rglob("*"):
            relative = path.relative_to(REPO / folder)
            if path.is_file() and "__pycache__" not in relative.parts and path.suffix not in (".pyc", ".pyo"):
                names.add(f"{installed}/{relative.as_posix()}")
    return names


def source_modules() -> set[str]:
    """The dotted name of every module of the package folders, as installed."""
    modules = set()
    for name in source_files():
        if name.endswith(".py"):
            parts = name[:-3].split("/")
            modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def _scratch() -> str | None:
    """/dev/shm where it has room: a venv of torch and friends is ~1.4 GB in 26k files, and deleting
    them from a virtual disk took 57 s here against 0.4 s from memory. None: the usual temp folder."""
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return None
    return "/dev/shm" if usage.free >= SCRATCH_MIN_FREE_BYTES else None


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    with tempfile.TemporaryDirectory(prefix="gwtf-wheel-", dir=_scratch()) as tmp:
        root = Path(tmp)
        src, dist, venv, work = root / "src", root / "dist", root / "venv", root / "work"
        src.mkdir()
        work.mkdir()
        for name in BUILD_FILES:
            shutil.copy2(REPO / name, src / name)
        for folder in PACKAGE_FOLDERS:
            shutil.copytree(REPO / folder, src / folder, ignore=IGNORED)
        _pip("wheel", "--quiet", "--no-deps", "--wheel-dir", dist, src)
        wheel = next(dist.glob("gwtfp2p-*.whl"))
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
        # --no-compile: byte-compiling torch and transformers would double the install time
        _pip("--python", venv / "bin" / "python", "install", "--quiet", "--no-compile", "--constraint", CONSTRAINTS,
             wheel)
        yield Installed(wheel=wheel, python=venv / "bin" / "python", bin=venv / "bin", workdir=work)


def test_the_wheel_holds_every_file_of_the_package_folders(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        in_wheel = {name for name in wheel.namelist() if not name.startswith("gwtfp2p-")}
    missing = sorted(source_files() - in_wheel)
    assert not missing, f"files left out of the wheel (setup.py / MANIFEST.in): {missing}"
    assert "gwtfp2p/data/geo10.json" in in_wheel
    assert not [n for n in in_wheel if "__pycache__" in n or n.endswith(".pyc")]


def test_every_installed_module_imports_without_the_extras(installed: Installed) -> None:
    result = installed.run(installed.python, "-I", Path(__file__).with_name("installed_check.py"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert not report["failures"], ("modules that fail to import from the wheel (an undeclared dependency, or an "
                                    "extra imported at module level):\n" + "\n".join(
                                        f"{m}: {e}" for m, e in report["failures"].items()))
    for name, origin in report["origins"].items():
        assert origin.startswith(report["prefix"]), f"{name} was imported from {origin}, not from the clean venv"
    assert report["optional_installed"] == [], "the clean venv should hold no extra (matplotlib is [plots])"
    assert set(report["imported"]) == source_modules(), "the installed modules differ from the sources'"


def test_gwtf_help_and_a_command_that_reads_package_data_run_from_the_wheel(installed: Installed) -> None:
    gwtf = installed.bin / "gwtf"
    help_text = installed.run(gwtf, "--help")
    assert help_text.returncode == 0, help_text.stderr[-3000:]
    for command in ("join", "status", "demo", "sim", "flow"):
        assert command in help_text.stdout
    join_help = installed.run(installed.python, "-m", "gwtf_cli.join_cmd", "--help")  # how local swarms start it
    assert join_help.returncode == 0 and "--heartbeat-file" in join_help.stdout, join_help.stderr[-3000:]
    solved = installed.run(gwtf, "flow", "solve", "--family", "geo10", "--json")
    assert solved.returncode == 0, solved.stderr[-3000:]
    result = json.loads(solved.stdout)
    assert result["flow_value"] > 0 and result["oracle_flow_value"] > 0
