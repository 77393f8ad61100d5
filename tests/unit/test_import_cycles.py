"""No import cycle anywhere in ``gwtfp2p`` (imports under ``TYPE_CHECKING`` count too).

The graph is grimp's (the library behind import-linter). Every strongly connected set of two or
more modules is a cycle; each test names the subpackage it checks, and a failure prints one
concrete circle with the importing lines, so it is clear which package owns the cycle.
"""

from __future__ import annotations

import pkgutil

import grimp
import networkx as nx
import pytest

import gwtfp2p

pytestmark = pytest.mark.timeout(60)
ROOT = "gwtfp2p"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(ROOT)


def _digraph(graph: grimp.ImportGraph, root: str = ROOT) -> nx.DiGraph:
    edges = nx.DiGraph()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] == root:
                edges.add_edge(module, imported)
    return edges


def _package(module: str) -> str:
    """``gwtfp2p.sim.routers.gwtf`` -> ``gwtfp2p.sim``; a top-level module is its own package."""
    return ".".join(module.split(".")[:2])


def _describe(graph: grimp.ImportGraph, edges: nx.DiGraph, members: set[str]) -> str:
    circle = nx.find_cycle(edges.subgraph(members))
    lines = []
    for importer, imported in circle:
        details = graph.get_import_details(importer=importer, imported=imported)
        where = f" (line {details[0]['line_number']}: {details[0]['line_contents']})" if details else ""
        lines.append(f"  {importer} -> {imported}{where}")
    return f"{len(members)} modules: {', '.join(sorted(members))}\n  one circle:\n" + "\n".join(lines)


def _cycles(graph: grimp.ImportGraph, root: str = ROOT) -> list[set[str]]:
    """Every set of two or more modules that import each other, directly or around a circle."""
    return [set(c) for c in nx.strongly_connected_components(_digraph(graph, root)) if len(c) > 1]


SUBPACKAGES = sorted(f"{ROOT}.{m.name}" for m in pkgutil.iter_modules(gwtfp2p.__path__))


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_no_import_cycle_within(graph, package):
    edges = _digraph(graph)
    found = [c for c in _cycles(graph) if {_package(m) for m in c} == {package}]
    assert not found, f"import cycle(s) in {package}:\n" + "\n".join(_describe(graph, edges, c) for c in found)


def test_no_import_cycle_across_packages(graph):
    edges = _digraph(graph)
    found = [c for c in _cycles(graph) if len({_package(m) for m in c}) > 1]
    assert not found, "import cycle(s) spanning packages:\n" + "\n".join(_describe(graph, edges, c) for c in found)


def test_the_check_finds_a_circle_and_names_its_package():
    graph = grimp.ImportGraph()
    for module in ("pkg.a", "pkg.a.x", "pkg.b"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.a.x")
    graph.add_import(importer="pkg.a.x", imported="pkg.b")
    assert _cycles(graph, "pkg") == []
    graph.add_import(importer="pkg.b", imported="pkg.a")
    assert _cycles(graph, "pkg") == [{"pkg.a", "pkg.a.x", "pkg.b"}]
    assert {_package(m) for m in _cycles(graph, "pkg")[0]} == {"pkg.a", "pkg.b"}
    assert "pkg.b -> pkg.a" in _describe(graph, _digraph(graph, "pkg"), _cycles(graph, "pkg")[0])
