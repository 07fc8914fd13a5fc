"""exirc's import graph, read from the source with `ast` (nothing is imported).

Not a test module: `test_import_rule.py` checks the rule on it, and the
graph helpers are what a contributor runs to see why a check fails.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "exirc"
# The FlatBuffers bindings flatc writes: each package is one leaf of the graph
# (its modules import only each other), so importing them is not importing
# their parent package.
GENERATED = ("exirc.serialize.generated", "exirc.serialize.xnnpack.generated")


@dataclass(frozen=True)
class Import:
    importer: str  # the module that imports, e.g. exirc.edge.verify
    imported: str  # the exirc module it names, e.g. exirc.ir.source
    line: int
    lazy: bool  # inside a function: runs when called, not when the module loads


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the package but the generated FlatBuffers bindings."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))
            if "generated" not in p.parts}


def _typing_only(tree: ast.Module) -> set[int]:
    """Ids of the nodes under `if TYPE_CHECKING:`: annotations, never run."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def _named(importer: str, node: ast.Import | ast.ImportFrom, is_package: bool,
           known: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        if node.level:
            base = importer.split(".")[: None if is_package else -1]
            base = base[: len(base) - node.level + 1]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        # `from exirc.runtime import arenas` names the module exirc.runtime.core.arenas.
        targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                   for alias in node.names]
    for target in targets:
        leaf = next((g for g in GENERATED if target.startswith(g)), None)
        if leaf is not None:
            yield leaf
            continue
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        if target in known and target != importer:
            yield target


def imports() -> list[Import]:
    """Every import of one exirc module by another, typing-only ones left out."""
    known = modules()
    found: dict[Import, None] = {}  # ordered, each import once
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = _typing_only(tree)
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in skipped:
                continue
            for target in _named(name, node, path.name == "__init__.py", known):
                found[Import(name, target, node.lineno, id(node) not in top_level)] = None
    return list(found)


def cycles(edges: list[Import]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.get(module, ())):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return groups
