"""The import graph of the rpcnet package has no cycles.

Every import counts: one inside a function (a lazy import hides a cycle, it does not remove it)
and one under ``if TYPE_CHECKING:`` (a type is a dependency too: a circle among annotations
means the module boundaries are wrong).
"""

from __future__ import annotations

import ast
from pathlib import Path

import rpcnet
from support.graphs import cycles

PACKAGE_DIR = Path(rpcnet.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names
                ]
            graph[name].update(t for t in targets if t in paths and t != name)
    return graph


def test_graph_sees_the_package():
    graph = import_graph()
    assert "rpcnet.compute.device" in graph
    assert "rpcnet.compute.derived" in graph["rpcnet.compute.device"]
    assert "rpcnet.compute.quant.iquants" in graph["rpcnet.compute.quant.codecs"]


def test_cycle_finder_finds_a_lazy_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    import x\nif TYPE_CHECKING:\n    import y\n")
    assert sorted(n.names[0].name for n in _imports(tree)) == ["x", "y"]


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    detail = [
        f"{' <-> '.join(c)}: edges "
        + ", ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
        for c in found
    ]
    assert not found, "import cycles:\n" + "\n".join(detail)


def test_compute_imports_nothing_from_server_or_transport():
    graph = import_graph()
    for name, imports in graph.items():
        if name.startswith("rpcnet.compute"):
            bad = {i for i in imports if i.startswith(("rpcnet.server", "rpcnet.transport"))}
            assert not bad, f"{name} imports {sorted(bad)}"
