"""Removing copies that copy nothing.

Decomposition leaves `view_copy` and `expand_copy` nodes whose output has
the input's shape and dtype (e.g. a reshape of a [1, 5, 8] tensor to
[1, 5, 8]). Each would cost a kernel call and a planned buffer. So does a
functional `copy(dst, src)` of a src of dst's shape and dtype (what
`buffer.copy_(src)` becomes): its result is src. Once it is gone, what was
computed from two such copies of one value (each layer's cache positions, from
its own cache's copy of `cache_position[0]`) is one computation that
`common_subexpressions` can merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.fx import Node

from exirc.ir.rewrite import Answer, rewrite_nodes
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

aten = torch.ops.aten
_COPIES = {aten.view_copy.default, aten.expand_copy.default, aten.alias_copy.default,
           aten.clone.default, aten._to_copy.default, aten.permute_copy.default,
           aten.copy.default}


def _source(node: Node) -> object:
    """The input whose values a copy's output holds."""
    return node.args[1] if node.target is aten.copy.default else node.args[0]


def _is_noop(node: Node) -> bool:
    source = _source(node)
    if not isinstance(source, Node):
        return False
    before, after = source.meta.get("val"), node.meta.get("val")
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    if node.target is aten.permute_copy.default and \
            list(node.args[1]) != list(range(before.dim())):  # type: ignore[arg-type]
        return False
    if node.target is aten._to_copy.default and set(node.kwargs) - {"dtype"}:
        return False
    return before.dtype == after.dtype and before.shape == after.shape


@dataclass(frozen=True)
class RemoveNoopCopies(Pass):
    """Edge -> Edge: drop copies whose output equals their input.

    A copy the method returns stays, so an output never aliases an input.
    """

    name: ClassVar[str] = "remove_noop_copies"

    def run(self, program: ExportedProgram) -> PassResult:
        return PassResult(program, rewrite_nodes(program.graph_module, _drop_noop))


def _drop_noop(node: Node) -> Answer:
    if node.target not in _COPIES or not _is_noop(node) or \
            any(user.op == "output" for user in node.users):
        return None
    source = _source(node)
    assert isinstance(source, Node)  # `_is_noop` checked
    return source
