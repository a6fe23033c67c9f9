"""The module layering docs/architecture.md promises, read from the source (no imports run).

- `rpcnet.transport` never imports `rpcnet.server`, `rpcnet.client` or `rpcnet.caps`;
- the session is sans-I/O: no socket, asyncio, file or thread module, and no coroutine;
- no import cycles among protocol/, transport/, server/, client.py, caps.py and cli.py
  (imports under `if TYPE_CHECKING:` count too: a cycle for the type checker is still one).
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "python"


def module_files() -> dict[str, Path]:
    out = {}
    for path in (SOURCE / "rpcnet").rglob("*.py"):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = module_files()


def imports_of(name: str) -> set[str]:
    """Every rpcnet module `name` imports, anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            candidates = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c in MODULES and c != name)
    return found


SCOPE_PACKAGES = ("rpcnet.protocol", "rpcnet.transport", "rpcnet.server")
SCOPE_MODULES = ("rpcnet.client", "rpcnet.caps", "rpcnet.cli")


def in_scope(name: str) -> bool:
    return name.startswith(SCOPE_PACKAGES) or name in SCOPE_MODULES


def test_the_source_tree_is_where_the_test_looks():
    assert {"rpcnet.server.session", "rpcnet.transport.base", "rpcnet.client"} <= set(MODULES)


def test_transport_does_not_import_server_client_or_caps():
    bad = {
        (name, dep)
        for name in MODULES
        if name.startswith("rpcnet.transport")
        for dep in imports_of(name)
        if dep.startswith(("rpcnet.server", "rpcnet.client", "rpcnet.caps"))
    }
    assert bad == set()


def test_session_does_no_io():
    tree = ast.parse(MODULES["rpcnet.server.session"].read_text())
    io_modules = {"socket", "asyncio", "select", "selectors", "threading", "os", "io", "pathlib"}
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported & io_modules == set()
    coroutines = [n.name for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef)]
    awaits = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Await)]
    opens = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "open"
    ]
    assert (coroutines, awaits, opens) == ([], [], [])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_in_the_serving_stack():
    graph = {
        name: {dep for dep in imports_of(name) if in_scope(dep)}
        for name in MODULES
        if in_scope(name)
    }
    assert find_cycle(graph) is None
