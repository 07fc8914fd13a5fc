"""The runtime's own layers, and where third-party packages may be imported.

    runtime base   exirc.runtime (its lazy public names), errors, machine,
                   tensor_layout: imported by any layer, importing none
    kernels        the base
    delegates      the base, kernels
    core           the base, kernels, delegates, and of the engines only the
                   seam (engines.seam) and the policy (engines.policy)
    engines        the seam and policy: the base; an engine (onnx_form,
                   onnxruntime, litert, torch_private): the base, kernels,
                   delegates, core, the seam and policy, and the engines it
                   builds on (onnxruntime and litert on onnx_form, litert on
                   onnxruntime), never the other way

onnx, onnxruntime and ai_edge_litert are imported only under
exirc.runtime.engines; torchao only by exirc.quantize and
exirc.ir.quantize_ops (the Q/DQ op definitions every stage reading a quantized
graph needs). No module imports another's private (underscored) names.
Imports under `if TYPE_CHECKING:` are exempt; lazy ones count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.layout.imports import Import, imports, modules

BASE = {"runtime", "errors", "machine", "tensor_layout"}
SEAM = {"engines.seam", "engines.policy", "engines"}
ENGINES_BUILT_ON = {"engines.onnx_form": set(), "engines.onnxruntime": {"engines.onnx_form"},
                    "engines.litert": {"engines.onnx_form", "engines.onnxruntime"},
                    "engines.torch_private": set()}
ALLOWED = {
    "text_generation": BASE | {"core"},
    "kernels": BASE,
    "delegates": BASE | {"kernels"},
    "core": BASE | {"kernels", "delegates"} | SEAM,
    "engines.seam": BASE | SEAM, "engines.policy": BASE, "engines": BASE,
    **{engine: BASE | {"kernels", "delegates", "core", "engines.torch_private"} | SEAM
       | built_on | {engine} for engine, built_on in ENGINES_BUILT_ON.items()},
}
THIRD_PARTY = {
    "onnx": "exirc.runtime.engines.", "onnxruntime": "exirc.runtime.engines.",
    "ai_edge_litert": "exirc.runtime.engines.",
    "torchao": ("exirc.quantize", "exirc.ir.quantize_ops"),
}


def layer(module: str) -> str | None:
    """The runtime layer of an `exirc.runtime...` module (None outside the runtime)."""
    parts = module.split(".")
    if parts[:2] != ["exirc", "runtime"]:
        return None
    if len(parts) == 2:
        return "runtime"
    if parts[2] == "engines" and len(parts) > 3:
        return f"engines.{parts[3]}"
    return parts[2]


def runtime_violations(edges: list[Import]) -> list[str]:
    found = []
    for edge in edges:
        importer, imported = layer(edge.importer), layer(edge.imported)
        if importer is None or imported is None or importer == imported:
            continue
        allowed = ALLOWED.get(importer)
        assert allowed is not None, f"{edge.importer}: layer {importer} has no rule: add it"
        if imported not in allowed:
            found.append(f"{edge.importer} imports {edge.imported} (line {edge.line}): "
                         f"{importer} may not import {imported}")
    return found


def test_runtime_layers_import_only_downwards() -> None:
    broken = runtime_violations(imports())
    assert not broken, "imports against the runtime's layers:\n" + "\n".join(broken)


def test_the_rule_catches_a_violating_import() -> None:
    """Proved once: the core importing an engine directly, or onnx_form importing
    the onnxruntime engine that builds on it, is caught."""
    bad = [Import("exirc.runtime.core.method", "exirc.runtime.engines.onnx_form.chain", 3, False),
           Import("exirc.runtime.engines.onnx_form.chain",
                  "exirc.runtime.engines.onnxruntime.engine", 4, True),
           Import("exirc.runtime.kernels.prim_ops", "exirc.runtime.core.arenas", 5, False)]
    assert len(runtime_violations(bad)) == 3
    fine = [Import("exirc.runtime.engines.litert.chain", "exirc.runtime.engines.onnx_form.chain",
                   6, False), Import("exirc.runtime.core.method", "exirc.runtime.engines.seam", 7,
                                     False)]
    assert runtime_violations(fine) == []


def _third_party_imports() -> Iterator[tuple[str, str, int]]:
    """(module, top-level package, line) of every import of a package in THIRD_PARTY,
    typing-only ones left out."""
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        typing_only = {id(inner) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for inner in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                else []
            for imported in names:
                top = imported.split(".")[0]
                if top in THIRD_PARTY:
                    yield name, top, node.lineno


def third_party_violations(found: Iterator[tuple[str, str, int]]) -> list[str]:
    return [f"{module} imports {package} (line {line})" for module, package, line in found
            if not module.startswith(THIRD_PARTY[package])]


def test_third_party_packages_are_imported_where_they_belong() -> None:
    broken = third_party_violations(_third_party_imports())
    assert not broken, "\n".join(broken)
    assert third_party_violations(iter([("exirc.runtime.core.loader", "onnx", 1),
                                        ("exirc.capture.load", "torchao", 2)])) != []


def test_no_module_imports_another_modules_private_names() -> None:
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and \
                    (node.module or "").startswith("exirc") and node.module != name:
                found += [f"{name} imports {node.module}.{alias.name} (line {node.lineno})"
                          for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not found, "\n".join(found)
