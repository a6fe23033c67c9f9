"""The Rust modules under rust/src form no cycle, and no source file is over 700 lines.

Each .rs file is one module (`lib.rs` is the crate, `x/mod.rs` is `x`); an inline `mod m { }`
block belongs to its file's module. An edge is any path that names another module: `use`
trees (`crate::`, `super::`, `self::`, or a child module's name) and `crate::…` / `super::…`
paths in code. `mod x;` declarations are no edge: a parent lists its children without depending
on them. Comments, strings and doc links are left out, as they never compile into a dependency.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from support.graphs import cycles

RUST_SRC = Path(__file__).resolve().parent.parent / "rust" / "src"
MAX_LINES = 700
CRATE = "crate"

_CHAR = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'")
_RAW = re.compile(r'r(#*)"')
_IDENT = re.compile(r"[A-Za-z_]\w*")
_PATH = re.compile(r"(?<![\w:$])((?:crate|super|self)(?:::(?:super|[A-Za-z_]\w*))+)")
_CHILD_PATH = re.compile(r"(?<![\w:$.])([a-z_]\w*)::")


def module_of(path: Path) -> str:
    parts = list(path.relative_to(RUST_SRC).with_suffix("").parts)
    if parts[-1] in ("lib", "mod"):
        parts = parts[:-1]
    return "::".join([CRATE, *parts])


def strip(text: str) -> str:
    """`text` with comments, string and char literals blanked (newlines kept)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif (m := _RAW.match(text, i)) and (i == 0 or not text[i - 1].isalnum()):
            end = text.find('"' + m.group(1), m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and (m := _CHAR.match(text, i)):
            out.append("' '")
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _use_trees(tree: str) -> list[list[str]]:
    """The paths of one `use` tree (`a::{b, c::d}` → a::b, a::c::d), `as` renames dropped."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))

    def expand(s: str) -> list[list[str]]:
        if "{" not in s:
            return [[p for p in s.split("::") if p]]
        head, rest = s.split("{", 1)
        body = rest[: rest.rfind("}")]
        items, depth, cur = [], 0, ""
        for ch in body:
            if ch == "," and depth == 0:
                items.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        items.append(cur)
        prefix = [p for p in head.split("::") if p]
        found = []
        for item in items:
            for sub in expand(item) if item else []:
                found.append(prefix + sub)
        return found or [prefix]

    return expand(tree)


def _resolve(segments: list[str], here: list[str]) -> list[str] | None:
    """Absolute path of `segments` seen from inline module path `here` (crate-rooted)."""
    if not segments:
        return None
    if segments[0] == CRATE:
        return segments
    if segments[0] == "self":
        return here + segments[1:]
    if segments[0] == "super":
        base = list(here)
        while segments and segments[0] == "super":
            base, segments = base[:-1], segments[1:]
        return base + segments
    return None


def _file_edges(
    name: str, path: Path, file_module: Callable[[list[str]], str | None], kids: set[str]
) -> set[str]:
    """The modules file module `name` (at `path`) names; `kids`: its child modules."""
    edges: set[str] = set()
    code = strip(path.read_text())
    base = name.split("::")
    # inline `mod x {` blocks: the module path at each offset
    stack: list[tuple[int, str]] = []
    depth = 0
    opens = {m.end() - 1: m.group(1) for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code)}
    here_at: list[tuple[int, list[str]]] = [(0, base)]
    for i, ch in enumerate(code):
        if ch == "{":
            depth += 1
            if i in opens:
                stack.append((depth, opens[i]))
                here_at.append((i, base + [s for _, s in stack]))
        elif ch == "}":
            if stack and stack[-1][0] == depth:
                stack.pop()
                here_at.append((i, base + [s for _, s in stack]))
            depth -= 1

    def here(offset: int) -> list[str]:
        cur = base
        for at, mods in here_at:
            if at > offset:
                break
            cur = mods
        return cur

    def add(target: list[str] | None) -> None:
        if target is None:
            return
        mod = file_module(target)
        if mod is not None and mod != name:
            edges.add(mod)

    def resolve_local(segments: list[str], at: int) -> list[str] | None:
        mod_path = here(at)
        got = _resolve(segments, mod_path)
        if got is None and segments and segments[0] in kids:
            # `use child::x` / `child::f()` from the file module itself
            got = base + segments
        return got

    use_spans = []
    for m in re.finditer(r"\buse\s+([^;]*);", code):
        use_spans.append((m.start(), m.end()))
        for segments in _use_trees(m.group(1)):
            add(resolve_local(segments, m.start()))
    for m in _PATH.finditer(code):
        if any(a <= m.start() < b for a, b in use_spans):
            continue
        add(_resolve(m.group(1).split("::"), here(m.start())))
    for m in _CHILD_PATH.finditer(code):
        if any(a <= m.start() < b for a, b in use_spans):
            continue
        if m.group(1) in kids:
            add(base + [m.group(1)])
    return edges


def module_graph() -> dict[str, set[str]]:
    files = sorted(RUST_SRC.rglob("*.rs"))
    modules = {module_of(p): p for p in files}
    children: dict[str, set[str]] = {m: set() for m in modules}
    for m in modules:
        if m != CRATE:
            children[m.rsplit("::", 1)[0]].add(m.rsplit("::", 1)[1])
    graph: dict[str, set[str]] = {m: set() for m in modules}

    def file_module(path: list[str]) -> str | None:
        """The longest prefix of `path` that is a file module."""
        for end in range(len(path), 0, -1):
            name = "::".join(path[:end])
            if name in modules:
                return name
        return None

    for name, path in modules.items():
        graph[name] = _file_edges(name, path, file_module, children[name])
    return graph


def test_parser_reads_use_trees_paths_and_inline_modules():
    assert _use_trees("super::{a, b::{c, d as e}}") == [
        ["super", "a"],
        ["super", "b", "c"],
        ["super", "b", "d"],
    ]
    assert _resolve(["super", "super", "x"], ["crate", "k", "f", "tests"]) == ["crate", "k", "x"]
    code = "let s = \"crate::x\"; // super::y\nlet c = '{';"
    assert strip(code) == "let s = \"\"; \nlet c = ' ';"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_graph_sees_the_crate():
    graph = module_graph()
    assert "crate::kernels" in graph
    assert "crate::errors" in graph["crate::framing"]
    assert any(m.startswith("crate::kernels") for m in graph["crate::py::kernels"])
    # the crate root declares every top-level module but depends on none of them
    assert not graph[CRATE]


def test_no_module_cycles():
    graph = module_graph()
    found = cycles(graph)
    detail = [
        " <-> ".join(c)
        + ": edges "
        + ", ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
        for c in found
    ]
    assert not found, "module cycles:\n" + "\n".join(detail)


def test_no_long_source_files():
    long = {
        str(p.relative_to(RUST_SRC)): n
        for p in sorted(RUST_SRC.rglob("*.rs"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"over {MAX_LINES} lines: {long}"
