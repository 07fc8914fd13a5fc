"""Removing runtime assertions that export leaves in the graph.

torch.export records checks such as `_assert_tensor_metadata` (from
`.to(dtype)`) and `_assert_scalar` (range facts about SymInts). They hold by
construction for a compiled program (shapes and dtypes are fixed by the
plan; dynamic sizes are checked against their bounds when inputs are), and
no kernel library implements them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from exirc.ir.control_flow import graph_modules
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

aten = torch.ops.aten
ASSERTIONS = frozenset({
    aten._assert_tensor_metadata.default,
    aten._assert_scalar.default,
    aten._assert_async.default,
    aten._assert_async.msg,
    aten.sym_constrain_range.default,
    aten.sym_constrain_range_for_size.default,
})


@dataclass(frozen=True)
class RemoveAssertions(Pass):
    """ATen/Edge -> same dialect, without export's runtime assertions."""

    name: ClassVar[str] = "remove_assertions"

    def run(self, program: ExportedProgram) -> PassResult:
        changed = False
        for module in graph_modules(program.graph_module):
            graph = module.graph
            erased = False
            for node in list(graph.nodes):
                if node.op == "call_function" and node.target in ASSERTIONS and not node.users:
                    graph.erase_node(node)
                    erased = True
            if erased:
                graph.eliminate_dead_code()
                module.recompile()
                changed = True
        return PassResult(program, changed)
