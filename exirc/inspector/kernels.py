"""The kernel libraries a program file needs: what a runtime must link to load it.

Each operator a method calls is served by a kernel library, named by the
operator's namespace: `aten::*` by ExecuTorch's portable kernels,
`quantized_decomposed::*` by its quantized kernel library (in Python,
`import executorch.kernels.quantized`), `llama::*` by its LLM custom ops,
`exirc::*` by exirc's own backend ops (exirc's runtime only). Delegates name
the backends the runtime must have registered (ExecuTorch's runtime ships
XnnpackBackend). A file whose delegates run everything needs no kernel library.
"""

from __future__ import annotations

from typing import Any

from exirc.serialize import program as P

# namespace -> the library that has its kernels
LIBRARIES = {
    "aten": "portable",
    "quantized_decomposed": "quantized",
    "llama": "llm custom ops",
    "exirc": "exirc backend ops",
}


def kernel_needs(program: P.Program) -> dict[str, Any]:
    """{"libraries": [{"name", "namespace", "operators"}], "delegates": [backend ids]}
    over every method, libraries in the order of LIBRARIES, then others by namespace."""
    by_namespace: dict[str, set[str]] = {}
    delegates: set[str] = set()
    for plan in program.execution_plan:
        for op in plan.operators:
            namespace = op.name.split("::", 1)[0] if "::" in op.name else ""
            by_namespace.setdefault(namespace, set()).add(op.qualified_name)
        delegates.update(d.id for d in plan.delegates)
    order = [n for n in LIBRARIES if n in by_namespace] + \
        sorted(n for n in by_namespace if n not in LIBRARIES)
    return {
        "libraries": [{"name": LIBRARIES.get(n, f"custom ({n or 'no namespace'})"),
                       "namespace": n, "operators": sorted(by_namespace[n])} for n in order],
        "delegates": sorted(delegates),
    }


def kernels_line(needs: dict[str, Any], shown: int = 3) -> str:
    """`portable (aten::add.out, +2 more), quantized (...); delegates: XnnpackBackend`."""
    parts = []
    for library in needs["libraries"]:
        ops = library["operators"]
        names = ops[:shown] + ([f"+{len(ops) - shown} more"] if len(ops) > shown else [])
        parts.append(f"{library['name']} ({', '.join(names)})")
    text = ", ".join(parts) if parts else "none outside the delegates" \
        if needs["delegates"] else "none"
    if needs["delegates"]:
        text += "; delegates: " + ", ".join(needs["delegates"])
    return text
