"""The core ATen operators the zoo exercises, measured with ExecuTorch.

Not a test module: a check of the zoo itself, run by hand when models are
added or changed:

    python -m tests.models.op_coverage            # every model
    python -m tests.models.op_coverage mlp bert   # some

For each model it lowers with ExecuTorch's own pipeline (`torch.export` ->
`to_edge` -> `to_executorch`), runs the program on ExecuTorch's portable
runtime, compares with eager PyTorch at the model's tolerance, and lists the
edge operators it uses. The summary counts the distinct `aten::` operator
names (overloads folded: `add.Tensor` and `add.Scalar` are one operator)
across the zoo, both in the edge graphs and in the final programs (where
ExecuTorch has turned some view copies into its own non-aten ops).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.models.zoo import ZOO, ZooModel


@dataclass
class Baseline:
    """What ExecuTorch's pipeline made of one zoo model."""

    name: str
    seconds: float
    edge_ops: set[str] = field(default_factory=set)  # "aten::add", ...
    program_ops: set[str] = field(default_factory=set)  # operator table of the .pte
    max_abs_error: float = 0.0
    matches: bool = False
    error: str = ""


def edge_operator_names(edge_program: Any) -> set[str]:
    """Qualified names (`aten::add`) of the operators called in an edge graph."""
    names = set()
    for node in edge_program.graph.nodes:
        if node.op != "call_function":
            continue
        schema = getattr(getattr(node.target, "_op", node.target), "_schema", None)
        if schema is not None:
            names.add(schema.name)
    return names


def aten_names(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith("aten::")}


def run_baseline(model: ZooModel) -> Baseline:
    """Lower `model` with ExecuTorch, run it on the portable runtime, compare."""
    from executorch.exir import to_edge

    from tests.oracle import run_with_executorch

    result = Baseline(model.name, 0.0)
    started = time.perf_counter()
    try:
        dynamic_shapes = model.dynamic_shapes() if model.dynamic_shapes else None
        exported = torch.export.export(
            model.module(), model.inputs(), dynamic_shapes=dynamic_shapes, strict=False
        )
        edge = to_edge(exported)
        result.edge_ops = edge_operator_names(edge.exported_program())
        manager = edge.to_executorch()
        result.seconds = time.perf_counter() - started
        plan = manager.executorch_program.execution_plan[0]
        result.program_ops = {op.name for op in plan.operators}
        got = run_with_executorch(bytes(manager.buffer), model.inputs())
    except Exception as error:  # a report, not a test: keep going
        result.seconds = time.perf_counter() - started
        result.error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        return result
    want = model.reference_outputs()
    if len(got) != len(want):
        result.error = f"{len(got)} outputs, eager has {len(want)}"
        return result
    result.matches = True
    for g, w in zip(got, want):
        if g.shape != w.shape or g.dtype != w.dtype:
            result.matches = False
            result.error = f"output {tuple(g.shape)} {g.dtype}, eager {tuple(w.shape)} {w.dtype}"
            continue
        if w.is_floating_point():
            diff = (g - w).abs().nan_to_num(0.0)
            if diff.numel():
                result.max_abs_error = max(result.max_abs_error, float(diff.max()))
        if not torch.allclose(g, w, rtol=model.rtol, atol=model.atol, equal_nan=True):
            result.matches = False
    return result


def main(names: list[str]) -> int:
    names = names or [n for n, m in ZOO.items() if m.available]
    edge_union: set[str] = set()
    edge_union_core: set[str] = set()  # models needing no optional package
    program_union: set[str] = set()
    total = 0.0
    failed = []
    for name in names:
        b = run_baseline(ZOO[name])
        total += b.seconds
        edge_union |= aten_names(b.edge_ops)
        if not ZOO[name].requires:
            edge_union_core |= aten_names(b.edge_ops)
        program_union |= aten_names(b.program_ops)
        status = "ok" if b.matches else f"FAIL {b.error}"
        print(
            f"{name:22s} {b.seconds:6.2f}s  max|err| {b.max_abs_error:.2e}  "
            f"{len(aten_names(b.edge_ops)):3d} ops  {status}"
        )
        if not b.matches:
            failed.append(name)
    print(f"\n{len(names)} models, ExecuTorch baseline {total:.1f} s")
    print(f"distinct aten ops in edge graphs: {len(edge_union)} "
          f"({len(edge_union_core)} without optional packages)")
    print(f"distinct aten ops in .pte operator tables: {len(program_union)}")
    print("  " + " ".join(sorted(n.removeprefix("aten::") for n in edge_union)))
    if failed:
        print(f"failed: {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
