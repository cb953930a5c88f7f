"""The packages' floors, read from the source: every import (module level or inside a function) may
only point down, and the only sideways arrow is latency -> export (it times exported graphs).

    kdnas (the CLI entry point)
    nas
    evaluation
    distill   export <- latency
    core (errors, spec, assets, files, sentence)
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FLOORS = {"core": 0, "distill": 1, "export": 1, "latency": 1, "evaluation": 2, "nas": 3, "kdnas": 4}
SIDEWAYS = {("latency", "export")}


def imported_packages(path: Path) -> set[str]:
    """Top-level project packages that `path` imports (relative imports stay inside its own package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & FLOORS.keys()
    return found


def package_arrows() -> dict[tuple[str, str], list[str]]:
    arrows: dict[tuple[str, str], list[str]] = {}
    for package in FLOORS:
        for path in sorted((REPO / package).rglob("*.py")):
            for target in imported_packages(path) - {package}:
                arrows.setdefault((package, target), []).append(str(path.relative_to(REPO)))
    return arrows


def allowed(source: str, target: str) -> bool:
    return FLOORS[target] < FLOORS[source] or (source, target) in SIDEWAYS


def test_every_import_points_down_a_floor():
    wrong = {f"{s} -> {t}": files for (s, t), files in package_arrows().items() if not allowed(s, t)}
    assert not wrong, wrong


def test_the_package_graph_has_no_cycle():
    graph: dict[str, set[str]] = {}
    for source, target in package_arrows():
        graph.setdefault(source, set()).add(target)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph.get(start, ()))

    assert not [p for p in FLOORS if reaches(p, p, set())]


def test_the_checker_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from nas.search import search\n    import latency._profile\n"
                      "    from . import sibling\n")
    assert imported_packages(source) == {"nas", "latency"}
    assert not allowed("distill", "nas") and not allowed("export", "latency") and allowed("latency", "export")


def test_no_function_is_longer_than_a_screen():
    long = []
    for package in FLOORS:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not long, long
