"""Views become copies: the Edge dialect has no op that aliases another's storage.

Each view op (`permute`, `view`, `_unsafe_view`, ...) is replaced by its
functional `_copy` twin (`permute_copy`, `view_copy`), which has an
out-variant that writes to planned memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.fx import Node

from exirc.edge.ops import copy_twin
from exirc.ir.rewrite import Answer, rewrite_nodes
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclass(frozen=True)
class ViewsToCopies(Pass):
    """Core ATen -> Edge: every view op becomes its functional `_copy` twin.

    Takes and returns an Edge-dialect candidate graph; a view op without a
    twin is left for the Edge verifier to report.
    """

    name: ClassVar[str] = "views_to_copies"

    def run(self, program: ExportedProgram) -> PassResult:
        return PassResult(program, rewrite_nodes(program.graph_module, _to_copy))


def _to_copy(node: Node) -> Answer:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or \
            not (target.is_view or target._schema.name == "aten::_unsafe_view"):
        return None
    twin = copy_twin(target)
    if twin is None:
        return None
    node.target = twin
    return node
