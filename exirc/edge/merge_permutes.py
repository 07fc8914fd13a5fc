"""A permute of a permute becomes one permute, or none when the two cancel.

Decomposing attention (`scaled_dot_product_attention`, then the model's own
`transpose(1, 2)`) leaves chains such as `permute(permute(x, [2, 0, 1, 3]),
[1, 2, 0, 3])`: two full copies of the tensor that move every element back
where it was. Each `permute_copy` is a kernel call and a planned buffer, so
the pair becomes `x` itself; a pair that does not cancel becomes one permute
of `x` by the composed order. The rewrite uses only `aten.permute_copy`, so
the program stays runnable on ExecuTorch's portable runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.fx import Node

from exirc.ir.rewrite import Answer, rewrite_nodes
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

_PERMUTE = torch.ops.aten.permute_copy.default


def composed_order(inner: Sequence[int], outer: Sequence[int]) -> list[int] | None:
    """The order `o` with permute(permute(x, inner), outer) == permute(x, o), or
    None when the two are not permutations of the same rank."""
    rank = len(inner)
    if len(outer) != rank:
        return None
    inner_dims = [d % rank for d in inner]
    outer_dims = [d % rank for d in outer]
    if sorted(inner_dims) != list(range(rank)) or sorted(outer_dims) != list(range(rank)):
        return None
    # Dim k of the result is dim outer[k] of the inner permute, which is x's inner[outer[k]].
    return [inner_dims[d] for d in outer_dims]


def _merge(node: Node) -> Answer:
    if node.target is not _PERMUTE or node.kwargs:
        return None
    inner = node.args[0]
    if not isinstance(inner, Node) or inner.target is not _PERMUTE or inner.kwargs:
        return None
    source, inner_order = inner.args
    order = composed_order(inner_order, node.args[1])  # type: ignore[arg-type]
    if order is None or not isinstance(source, Node):
        return None
    returned = any(user.op == "output" for user in node.users)
    if order == list(range(len(order))) and not returned:
        return source  # the pair cancels (a returned value stays a copy of its own)
    if len(inner.users) > 1:
        return None  # the inner permute stays for its other users: merging saves nothing
    node.args = (source, order)
    return node


@dataclass(frozen=True)
class MergePermutes(Pass):
    """Edge -> Edge: `permute_copy(permute_copy(x, p), q)` becomes `x` when q
    undoes p, else `permute_copy(x, p∘q)` when the inner permute has no other
    user. Output values stay copies, never the input itself."""

    name: ClassVar[str] = "merge_permutes"

    def run(self, program: ExportedProgram) -> PassResult:
        changed = rewrite_nodes(program.graph_module, _merge, eliminate_dead_code=True)
        return PassResult(program, changed)
