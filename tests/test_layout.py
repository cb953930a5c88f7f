"""The packages' floors, read from the source: every import (module level or inside a function) may
only point down, and the only sideways arrow is latency -> export (it times exported graphs). One
installed package: the top-level folders are `kdnas.core`, `kdnas.distill`, ... and are imported by
those names only. Another package is used through its facade (`__init__`), never through a private
module (`_name`) — but for the command modules (`_cli`) the CLI floor assembles.

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
COMMAND_MODULES = {"_cli", "_eval_cli", "_export_cli"}  # what kdnas.cli registers


def _imports(path: Path) -> list[str]:
    """Every absolute module path `path` imports, `from a.b import c` read as `a.b.c` too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def _package(module: str) -> str | None:
    """The project package of a module path: `kdnas.nas.final` -> nas, `kdnas.cli` -> kdnas."""
    parts = module.split(".")
    if parts[0] != "kdnas":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else "kdnas"


def imported_packages(path: Path) -> set[str]:
    """Project packages that `path` imports (relative imports stay inside its own package)."""
    return {p for p in map(_package, _imports(path)) if p is not None}


def unqualified_imports(path: Path) -> set[str]:
    """Imports of a project folder by its bare name (`import core`): the installed package has none."""
    return {m.split(".")[0] for m in _imports(path)} & (FLOORS.keys() - {"kdnas"})


def private_reaches(path: Path, own: str) -> set[str]:
    """Private modules of another package that `path` imports."""
    return {m for m in _imports(path) if _package(m) not in (None, own, "kdnas")
            and any(part.startswith("_") and part != "__init__" for part in m.split(".")[2:3])
            and not (own == "kdnas" and m.split(".")[2] in COMMAND_MODULES)}


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
    source.write_text("import os\n\ndef f():\n    from kdnas.nas.search import search\n    import kdnas.latency._profile\n"
                      "    from . import sibling\n    from kdnas.export import _graph\n")
    assert imported_packages(source) == {"nas", "latency", "export"}
    assert private_reaches(source, "evaluation") == {"kdnas.latency._profile", "kdnas.export._graph"}
    assert private_reaches(source, "latency") == {"kdnas.export._graph"}
    assert not allowed("distill", "nas") and not allowed("export", "latency") and allowed("latency", "export")


def test_no_function_is_longer_than_a_screen():
    long = []
    for package in FLOORS:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert not long, long


def test_packages_use_each_other_through_their_facades_by_their_installed_names():
    private, bare = {}, {}
    for package in FLOORS:
        for path in sorted((REPO / package).rglob("*.py")):
            name = str(path.relative_to(REPO))
            if found := private_reaches(path, package):
                private[name] = sorted(found)
            if found := unqualified_imports(path):
                bare[name] = sorted(found)
    for folder in ("tests", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if found := unqualified_imports(path):
                bare[str(path.relative_to(REPO))] = sorted(found)
    assert not private, private
    assert not bare, bare


# Optuna's attribute store of a study or a trial: the storage edge, which only nas/schema.py touches.
STORAGE_EDGE = {"user_attrs", "system_attrs", "set_user_attr", "set_system_attr", "set_trial_user_attr", "enqueue_trial"}


def storage_edge_uses(path: Path) -> list[int]:
    """The lines of `path` that read or write Optuna's attributes directly (an attribute or a keyword)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr in STORAGE_EDGE:
            lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "user_attrs":
            lines.append(node.value.lineno)
    return sorted(lines)


def test_the_checker_sees_attribute_reads_writes_and_keywords(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("a = t.user_attrs\nt.set_user_attr('k', 1)\ns.enqueue_trial({}, user_attrs={})\nb = t.params\n")
    assert storage_edge_uses(source) == [1, 2, 3, 3]


def test_only_the_schema_module_reads_and_writes_study_and_trial_attributes():
    found = {str(path.relative_to(REPO)): lines for path in sorted((REPO / "nas").rglob("*.py"))
             if path.name != "schema.py" and (lines := storage_edge_uses(path))}
    assert not found, found
