"""The embedded default corpus: documentation strings of the Python standard library.

Owns building the offline demo corpus at run time from the running interpreter's own standard
library sources (parsed with ``ast``, nothing is imported or executed), so no corpus text is
committed and any machine with Python has it. The text depends on the Python version; every data
holder reads only its own shard of it. Falls back to the builtins' docstrings where the standard
library ships without sources.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import logging
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


@functools.lru_cache(maxsize=1)
def default_corpus() -> tuple[str, ...]:
    """The corpus documents (one docstring each, titled by its qualified name), in a fixed order."""
    docs: list[str] = []
    for name in CORPUS_MODULES:
        for path in _module_sources(name):
            stem = name if path.name == "__init__.py" or path.stem == name else f"{name}.{path.stem}"
            docs.extend(_docstrings(path, stem))
    if not docs:
        log.warning("standard library sources not found; the default corpus uses builtins' docstrings")
        for attr in sorted(dir(builtins)):
            doc = getattr(getattr(builtins, attr), "__doc__", None)
            if isinstance(doc, str) and len(doc) >= 40:
                docs.append(f"{attr}\n\n{doc}\n")
    return tuple(docs)
