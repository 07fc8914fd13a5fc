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
from torch.fx import Node

from exirc.ir.rewrite import ERASE, Answer, rewrite_nodes
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
        changed = rewrite_nodes(program.graph_module, _remove, eliminate_dead_code=True)
        return PassResult(program, changed)


def _remove(node: Node) -> Answer:
    return ERASE if node.target in ASSERTIONS and not node.users else None
