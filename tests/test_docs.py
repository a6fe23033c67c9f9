"""The docs are reference pages: docs/benchmarks.md is generated from bench/results, and neither
the docs nor the sources carry work history (issue numbers, work sessions)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TREES = ("python", "rust", "tests", "bench", "docs", "tools")
SUFFIXES = {".md", ".py", ".pyi", ".rs", ".cu", ".cuh", ".h", ".sh"}
SKIP_PARTS = {"target", "__pycache__", ".mypy_cache", "node_modules"}

#: "issue 10", "Issue #12"
ISSUE = re.compile(r"\b[Ii]ssue ?#?[0-9]+")
#: a work session ("the ninth session", "previous session"), not a client's protocol session
ORDINAL = (
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|[a-z]+teenth|[a-z]+tieth|twenty-[a-z]+|[0-9]+(?:st|nd|rd|th)"
)
WORK_SESSION = re.compile(
    rf"\b(?:{ORDINAL}|previous|earlier|next|last|later) sessions?\b", re.IGNORECASE
)
#: "this session" is a client's session in the server's code; in docs and benches it is history
THIS_SESSION = re.compile(r"\bthis session\b", re.IGNORECASE)


def _files() -> list[Path]:
    out = []
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and not SKIP_PARTS & set(path.parts):
                out.append(path)
    return out


def _report():  # bench/report.py, which is not a package module
    spec = importlib.util.spec_from_file_location("bench_report", REPO / "bench" / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_report", module)
    spec.loader.exec_module(module)
    return module


def test_benchmarks_page_is_generated_from_the_results() -> None:
    report = _report()
    doc = REPO / "docs" / "benchmarks.md"
    assert doc.read_text() == report.render(), (
        "docs/benchmarks.md differs from bench/results: run python bench/report.py"
    )


def test_every_result_names_its_command_and_machine() -> None:
    report = _report()
    for name, result in report.load().items():
        if name == "engine":
            assert result["config"]["commands"], name
            assert {"cpu", "flags", "cores"} <= set(result["machine"]), name
        else:
            assert result["command"] and result["script"], name
            assert {"cpu", "flags", "cores"} <= set(result["machine"]), name
            assert (REPO / result["script"]).is_file(), result["script"]


@pytest.mark.parametrize(
    ("pattern", "trees"),
    [(ISSUE, TREES), (WORK_SESSION, TREES), (THIS_SESSION, ("docs", "bench"))],
    ids=["issue-numbers", "work-sessions", "this-session"],
)
def test_no_work_history(pattern: re.Pattern[str], trees: tuple[str, ...]) -> None:
    hits = []
    for path in _files():
        rel = path.relative_to(REPO)
        if rel.parts[0] not in trees or path == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not hits, "work history belongs in git, not here:\n" + "\n".join(hits)


def test_index_lists_every_page() -> None:
    index = (REPO / "docs" / "index.md").read_text()
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    linked = set(re.findall(r"\]\(([a-z0-9_-]+\.md)\)", index))
    assert pages == linked, (sorted(pages - linked), sorted(linked - pages))
