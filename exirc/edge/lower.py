"""ATen dialect -> Edge dialect: decompose to core ATen, views become copies.

The Edge dialect admits only core ATen ops, each functional: a view op is
replaced by its `_copy` twin so every op has an out-variant that writes to
planned memory, and no node aliases another's storage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclass(frozen=True)
class ToEdge(Pass):
    """ATen -> core ATen: run torch's core decomposition table.

    `keep` names ops (e.g. "aten.linear.default") left undecomposed because a
    target has a kernel for them that beats their decomposition.
    """

    name: ClassVar[str] = "to_edge"
    keep: tuple[str, ...] = ()

    def run(self, program: ExportedProgram) -> PassResult:
        table = torch.export.default_decompositions()
        for op_name in self.keep:
            table.pop(_resolve_op(op_name), None)
        return PassResult(program.run_decompositions(table), changed=True)


def _resolve_op(qualified: str) -> torch._ops.OpOverload:
    namespace, name, overload = qualified.split(".")
    packet = getattr(getattr(torch.ops, namespace), name)
    op: torch._ops.OpOverload = getattr(packet, overload)
    return op


def copy_twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional `_copy` op of a view op, e.g. permute -> permute_copy."""
    name = op._schema.name.split("::")[1]
    namespace = op.namespace
    packet = getattr(getattr(torch.ops, namespace), f"{name.lstrip('_')}_copy", None)
    if name == "_unsafe_view":
        packet = torch.ops.aten.view_copy
    if packet is None:
        return None
    twin = getattr(packet, op._overloadname, None)
    return twin if isinstance(twin, torch._ops.OpOverload) else None


@dataclass(frozen=True)
class ViewsToCopies(Pass):
    """Core ATen -> Edge: every view op becomes its functional `_copy` twin.

    Takes and returns an Edge-dialect candidate graph; a view op without a
    twin is left for the Edge verifier to report.
    """

    name: ClassVar[str] = "views_to_copies"

    def run(self, program: ExportedProgram) -> PassResult:
        changed = False
        for node in program.graph_module.graph.nodes:
            target = node.target
            if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
                continue
            if not (target.is_view or target._schema.name == "aten::_unsafe_view"):
                continue
            twin = copy_twin(target)
            if twin is not None:
                node.target = twin
                changed = True
        if changed:
            program.graph_module.recompile()
        return PassResult(program, changed)
