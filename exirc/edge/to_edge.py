"""ATen dialect -> core ATen: decompose every op the Edge dialect does not admit.

The Edge dialect admits only core ATen ops, each functional. This pass
lowers the rest through torch's decomposition tables; `views_to_copies`
then makes the views functional.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from exirc.edge.decompositions import EXTRA_DECOMPOSITIONS
from exirc.edge.ops import is_edge_op
from exirc.ir.control_flow import all_nodes
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
        table.update(EXTRA_DECOMPOSITIONS)
        for op_name in self.keep:
            table.pop(_resolve_op(op_name), None)
        with warnings.catch_warnings():
            # torch warns about its own internals here (pytree's LeafSpec), which
            # says nothing to a user and would be the first line of `-v` output.
            warnings.simplefilter("ignore", FutureWarning)
            program = program.run_decompositions(table)
            # torch's default table keeps some non-core ops (linalg_vector_norm)
            # that another of its decompositions lowers to core ops. Use those,
            # one op at a time, and only when the result is core ATen: a lowering
            # to `prims` would hide the user's op behind one they never wrote.
            for op, decomposition in _decomposable_leftovers(program).items():
                candidate = program.run_decompositions({op: decomposition})
                if _core_only(candidate):
                    program = candidate
        return PassResult(program, changed=True)


def _non_core_targets(program: ExportedProgram) -> set[Any]:
    return {node.target for node in all_nodes(program.graph_module)
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.core not in node.target.tags and not node.target.is_view}


def _core_only(program: ExportedProgram) -> bool:
    return all(is_edge_op(target) for target in _non_core_targets(program))


def _decomposable_leftovers(program: ExportedProgram) -> dict[Any, Any]:
    from torch._decomp import decomposition_table

    return {target: decomposition_table[target] for target in _non_core_targets(program)
            if target in decomposition_table}


def _resolve_op(qualified: str) -> torch._ops.OpOverload:
    namespace, name, overload = qualified.split(".")
    packet = getattr(getattr(torch.ops, namespace), name)
    op: torch._ops.OpOverload = getattr(packet, overload)
    return op
