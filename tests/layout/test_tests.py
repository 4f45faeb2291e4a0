"""Every test in the default run checks something: its body (or a helper it calls, found by
name anywhere under tests/) holds an `assert`, `pytest.raises` or `pytest.fail` (issue 23)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CHECKS = {"raises", "fail"}  # pytest.raises / pytest.fail


def _called(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def _checks_itself(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node)) or bool(_called(node) & CHECKS)


def _functions() -> list[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((path, node))
    return out


def _benchmark(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("benchmark" in ast.unparse(d) for d in fn.decorator_list)


def test_every_test_checks_something():
    functions = _functions()
    checking = {fn.name for _, fn in functions if _checks_itself(fn)}
    while True:  # helpers that call checking helpers check too
        more = {fn.name for _, fn in functions
                if fn.name not in checking and _called(fn) & checking}
        if not more:
            break
        checking |= more
    bare = [f"{path.relative_to(TESTS)}::{fn.name}" for path, fn in functions
            if fn.name.startswith("test_") and path.name.startswith("test_")
            and not _benchmark(fn) and not (_checks_itself(fn) or _called(fn) & checking)]
    assert not bare, "tests that check nothing:\n" + "\n".join(sorted(bare))


def test_the_scan_finds_a_test_without_a_check():
    tree = ast.parse("def test_x():\n    print(1)\n\ndef test_y():\n    assert 1 == 1\n")
    fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert [f.name for f in fns if not _checks_itself(f)] == ["test_x"]
