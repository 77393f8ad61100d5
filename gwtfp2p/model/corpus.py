"""The embedded default corpus: documentation strings of the Python standard library.

Owns building the offline demo corpus at run time from the running interpreter's own standard
library sources (parsed with ``ast``, nothing is imported or executed), so no corpus text is
committed and any machine with Python has it. The text depends on the Python version; every data
holder reads only its own shard of it. Falls back to the builtins' docstrings where the standard
library ships without sources. Parsing takes seconds, so the result is cached as JSON in the user's
cache directory, keyed by the interpreter and the size and mtime of every source file read.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# Top-level standard-library modules whose docstrings form the corpus, in this order.
CORPUS_MODULES = (
    "argparse", "ast", "base64", "bisect", "calendar", "cmd", "collections", "configparser", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email", "enum", "fractions", "ftplib",
    "functools", "getopt", "gettext", "glob", "gzip", "heapq", "hmac", "html", "http", "imaplib", "inspect",
    "ipaddress", "json", "locale", "logging", "mailbox", "numbers", "optparse", "pathlib", "pickle",
    "pprint", "pydoc", "queue", "random", "shlex", "shutil", "smtplib", "statistics", "string",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "tokenize", "traceback", "typing",
    "unittest", "urllib", "uuid", "warnings", "weakref", "zipfile",
)


def _module_sources(name: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(name)  # top-level names only: finds, never imports
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    origin = Path(spec.origin)
    if origin.name == "__init__.py":
        return sorted(origin.parent.glob("*.py"))
    return [origin]


def _docstrings(path: Path, module: str) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    docs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 40:
                title = module if isinstance(node, ast.Module) else f"{module}.{node.name}"
                docs.append(f"{title}\n\n{doc}\n")
    return docs


def _sources() -> list[tuple[Path, str]]:
    """Every source file the corpus reads, with the title prefix of its docstrings, in order."""
    sources = []
    for name in CORPUS_MODULES:
        for path in _module_sources(name):
            sources.append((path, name if path.name == "__init__.py" or path.stem == name else f"{name}.{path.stem}"))
    return sources


def _cache_path(sources: list[tuple[Path, str]]) -> Path:
    key = hashlib.sha256(sys.version.encode())
    for path, stem in sources:
        try:
            stat = path.stat()
        except OSError:
            continue
        key.update(f"{path}|{stem}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "gwtf" / f"corpus-{key.hexdigest()[:16]}.json"


def _cached(path: Path) -> tuple[str, ...] | None:
    try:
        docs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return tuple(docs) if isinstance(docs, list) and all(isinstance(d, str) for d in docs) else None


def _store(path: Path, docs: tuple[str, ...]) -> None:
    """Write the cache atomically; a read-only or missing home only costs the next start its parse."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False) as f:
            json.dump(list(docs), f)
        os.replace(f.name, path)
    except OSError as e:
        log.debug("corpus cache not written (%s)", e)


@functools.lru_cache(maxsize=1)
def default_corpus() -> tuple[str, ...]:
    """The corpus documents (one docstring each, titled by its qualified name), in a fixed order."""
    sources = _sources()
    cache = _cache_path(sources)
    cached = _cached(cache) if sources else None
    if cached is not None:
        return cached
    docs: list[str] = []
    for path, stem in sources:
        docs.extend(_docstrings(path, stem))
    if not docs:
        log.warning("standard library sources not found; the default corpus uses builtins' docstrings")
        for attr in sorted(dir(builtins)):
            doc = getattr(getattr(builtins, attr), "__doc__", None)
            if isinstance(doc, str) and len(doc) >= 40:
                docs.append(f"{attr}\n\n{doc}\n")
    elif sources:
        _store(cache, tuple(docs))
    return tuple(docs)
