"""The import rule: the package's folders are the pipeline, and imports follow it.

    errors                  imports nothing of exirc
    serialize (the format)  errors
    targets (data)          errors
    runtime                 errors, serialize, targets; never a compiler stage
    ir, passes              errors, serialize, targets: shared by every stage
    capture -> quantize -> aten -> edge -> backend -> plan -> emit
                            each stage: the above but the runtime, and the
                            stages before it
    pipelines, compiler (and compile_result), diagnostics, inspector, cli
                            on top: anything

No module imports itself back, however indirectly (imports under
`if TYPE_CHECKING:` excepted: they never run). A lazy import inside a function
counts: it is the same dependency, only later.
"""

from __future__ import annotations

from tests.layout.imports import Import, cycles, imports, modules

BASE = ("errors", "serialize", "targets")
SHARED = ("ir", "passes")
STAGES = ("capture", "quantize", "aten", "edge", "backend", "plan", "emit")
ON_TOP = ("pipelines", "compiler", "compile_result", "diagnostics", "inspector", "cli",
          "__main__")


def part(module: str) -> str:
    """The folder (or root module) of exirc a module belongs to: `edge`, `errors`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "exirc"


def allowed(importer: str, imported: str) -> bool:
    """Whether the rule lets the part of `importer` import the part of `imported`."""
    if importer == imported or imported == "exirc":
        return True
    if importer in ON_TOP or importer == "exirc":
        return True
    if importer == "errors":
        return False
    if importer in ("serialize", "targets"):
        return imported == "errors"
    if importer == "runtime":
        return imported in BASE
    if importer in SHARED:
        return imported in BASE
    if importer in STAGES:
        earlier = STAGES[: STAGES.index(importer)]
        return imported in BASE + SHARED + earlier
    raise AssertionError(f"exirc.{importer} has no place in the import rule: add it")


def test_every_part_has_a_place_in_the_rule() -> None:
    for module in modules():
        allowed(part(module), "errors")


def test_imports_follow_the_pipeline() -> None:
    broken = [edge for edge in imports() if not allowed(part(edge.importer), part(edge.imported))]
    assert not broken, "imports against the rule:\n" + "\n".join(map(_show, broken))


def test_no_import_cycles() -> None:
    found = cycles(imports())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(group) for group in found)


def _show(edge: Import) -> str:
    lazy = " (inside a function)" if edge.lazy else ""
    return f"  {edge.importer} imports {edge.imported}{lazy} (line {edge.line})"


def test_the_rule_reads_a_known_import() -> None:
    """The graph is read right: a failure of the rule tests is not a parsing slip."""
    known = Import("exirc.runtime.core.loader", "exirc.serialize.mapped_file", 0, False)
    assert known.imported in {
        edge.imported for edge in imports() if edge.importer == "exirc.runtime.core.loader"}
