"""Flake hunt: run the real-process suites N times the way CI runs them and tabulate every test's outcomes.

Each round is what CI meets: a fresh clone of a commit (``--ref``, default HEAD; uncommitted changes are
not in it), a read-only copy of ``../shared`` beside it, a fresh ``.venv`` made by ``make install``,
``CI=true``, no standard input, ``VIRTUAL_ENV``/``PYTHONPATH`` unset. The suites run with retries off
(``-p no:rerunfailures``): a hunt counts first tries. At the end it prints, per test, passes, failures
and the first line of each distinct failure, and writes them as JSON (``--json``). It measures; it
asserts nothing. Its exit status is 1 when any test failed in any round. With ``--json`` the table is written
after every round (a hunt cut short keeps the rounds it finished); with ``--logs DIR`` the daemons' logs of
every failed test (its pytest temporary folder) are kept under ``DIR/round-N/``.

    make flake-hunt N=5                       # integration + adversarial suites, 5 fresh clones
    python benchmarks/flake_hunt.py --rounds 3 --suite tests/integration/test_churn_data_holder.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SUITES = ("tests/adversarial", "tests/integration")
INSTALL_TIMEOUT_S = 1800.0
ROUND_TIMEOUT_S = 5400.0


@dataclass
class Tally:
    """One test's outcomes over the rounds."""

    passed: int = 0
    failed: int = 0
    first_lines: dict[str, int] = field(default_factory=dict)  # first line of each failure -> rounds


def ci_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["CI"] = "true"
    return env


def read_only(tree: Path) -> None:
    for path in [tree, *tree.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode):
            path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def fresh_clone(ref: str, workdir: Path) -> Path:
    """A clone of ``ref`` at ``workdir/repo`` and a read-only ``../shared`` beside it, as CI lays them out."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"], check=True,
                         capture_output=True, text=True).stdout.strip()
    repo = workdir / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "--detach", sha], check=True)
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        shutil.copytree(shared, workdir / "shared", symlinks=True)
        read_only(workdir / "shared")
    return repo


def first_line(case: ET.Element) -> str | None:
    """The first line of a test case's failure or error message, or None when it passed or was skipped."""
    for tag in ("failure", "error"):
        node = case.find(tag)
        if node is not None:
            text = (node.get("message") or node.text or tag).strip()
            return text.splitlines()[0][:200] if text else tag
    return None


def outcomes(junit: Path) -> dict[str, str | None]:
    """Test id -> None (passed) or its failure's first line, from pytest's JUnit XML."""
    result: dict[str, str | None] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            continue
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        line = first_line(case)
        if test_id in result and result[test_id] is not None and line is None:
            continue  # a teardown error is reported as a second case of the same test: keep the failure
        result[test_id] = line
    return result


def keep_failed_logs(basetemp: Path, result: dict[str, str | None], dest: Path) -> None:
    """Copy the pytest temporary folders of the failed tests (their daemons' logs) to ``dest``."""
    for test_id, line in result.items():
        if line is None or not basetemp.is_dir():
            continue
        prefix = re.sub(r"\W", "_", test_id.rsplit("::", 1)[-1])[:30]  # how pytest names a test's tmp_path
        for folder in basetemp.glob(f"{prefix}*"):
            if folder.is_dir() and not folder.is_symlink():
                shutil.copytree(folder, dest / folder.name, dirs_exist_ok=True)


def run_round(ref: str, suites: list[str], index: int, keep: bool, logs: Path | None) -> dict[str, str | None]:
    workdir = Path(tempfile.mkdtemp(prefix=f"gwtf-flake-hunt-{index}-"))
    try:
        repo = fresh_clone(ref, workdir)
        log = workdir / "round.log"
        with open(log, "w") as out:
            started = time.monotonic()
            subprocess.run(["make", "install"], cwd=repo, env=ci_env(), stdin=subprocess.DEVNULL, stdout=out,
                           stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S, check=True)
            junit, basetemp = workdir / "junit.xml", workdir / "tmp"
            subprocess.run([str(repo / ".venv/bin/python"), "-m", "pytest", "-q", "-p", "no:rerunfailures",
                            f"--junitxml={junit}", f"--basetemp={basetemp}", *suites], cwd=repo, env=ci_env(),
                           stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, timeout=ROUND_TIMEOUT_S)
        result = outcomes(junit) if junit.exists() else {"<no junit report>": f"see {log}"}
        if logs is not None:
            keep_failed_logs(basetemp, result, logs / f"round-{index}")
            shutil.copy(log, logs / f"round-{index}.log")
        failed = sum(line is not None for line in result.values())
        print(f"round {index}: {len(result) - failed} passed, {failed} failed in "
              f"{time.monotonic() - started:.0f} s ({workdir})", flush=True)
        return result
    finally:
        if not keep:
            for path in [workdir, *workdir.rglob("*")]:  # the read-only shared/ copy
                if path.is_dir() and not path.is_symlink():
                    path.chmod(path.stat().st_mode | stat.S_IWUSR)
            shutil.rmtree(workdir, ignore_errors=True)


def tabulate(rounds: list[dict[str, str | None]]) -> dict[str, Tally]:
    tallies: dict[str, Tally] = defaultdict(Tally)
    for result in rounds:
        for test_id, line in result.items():
            tally = tallies[test_id]
            if line is None:
                tally.passed += 1
            else:
                tally.failed += 1
                tally.first_lines[line] = tally.first_lines.get(line, 0) + 1
    return dict(sorted(tallies.items(), key=lambda item: (-item[1].failed, item[0])))


def print_table(tallies: dict[str, Tally], rounds: int) -> None:
    print(f"\n| test | passed | failed | first line of each failure (rounds) |  ({rounds} rounds)")
    print("|---|---:|---:|---|")
    for test_id, tally in tallies.items():
        lines = "; ".join(f"`{line}` ({n})" for line, n in tally.first_lines.items())
        print(f"| `{test_id}` | {tally.passed} | {tally.failed} | {lines} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh clones to run the suites in (default 5)")
    parser.add_argument("--ref", default="HEAD", help="the commit or branch to clone (default HEAD)")
    parser.add_argument("--suite", action="append", dest="suites",
                        help=f"a test path to run (repeatable; default {' '.join(DEFAULT_SUITES)})")
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep each round's clone and log")
    parser.add_argument("--logs", type=Path, help="keep each round's log and its failed tests' daemon logs here")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    suites = args.suites or list(DEFAULT_SUITES)
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    rounds: list[dict[str, str | None]] = []
    for i in range(1, args.rounds + 1):
        rounds.append(run_round(args.ref, suites, i, args.keep, args.logs))
        tallies = tabulate(rounds)
        if args.json:
            args.json.write_text(json.dumps({"ref": args.ref, "suites": suites, "rounds": len(rounds), "tests": {
                k: {"passed": t.passed, "failed": t.failed, "failures": t.first_lines} for k, t in tallies.items()}},
                indent=1) + "\n")
    print_table(tallies, len(rounds))
    return 1 if any(t.failed for t in tallies.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
