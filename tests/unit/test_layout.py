"""The package's shape rules, checked: every module says what it owns (a docstring at the top), no
module in ``gwtfp2p/`` or ``cli/`` is over 500 lines, none in ``daemon/`` over 300, and only the daemon's
lifecycle sees the whole node (no ``node: Node`` parameter elsewhere)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted([*(ROOT / "gwtfp2p").rglob("*.py"), *(ROOT / "cli").rglob("*.py")])


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", MODULES, ids=_relative)
def test_every_module_has_a_docstring_and_a_bounded_size(path: Path) -> None:
    text = path.read_text()
    lines = len(text.splitlines())
    limit = 300 if "/daemon/" in _relative(path) else 500
    assert lines <= limit, f"{_relative(path)} has {lines} lines (limit {limit}): split it by concern"
    if text.strip():
        assert ast.get_docstring(ast.parse(text)), f"{_relative(path)} has no module docstring"


def test_only_the_lifecycle_sees_the_whole_node() -> None:
    pattern = re.compile(r"\bnode: Node\b")
    offenders = [_relative(p) for p in MODULES if pattern.search(p.read_text())
                 and _relative(p) != "gwtfp2p/daemon/lifecycle/node.py"]
    assert offenders == []
