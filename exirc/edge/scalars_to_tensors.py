"""Scalars to tensors: the Edge dialect has no scalars on tensor edges.

After decomposition, ops such as `aten.mul.Tensor(x, 0.35)` carry a Python
number where the schema says Tensor (torch wraps it at run time). Kernels
of the Edge dialect take tensors there, so the number becomes a 0-d
constant tensor. A 0-d tensor promotes like the wrapped number it replaces
(it never widens a tensor of the same category), so results are unchanged.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.fx import Node

from exirc.edge.constants import add_constant
from exirc.ir.control_flow import ConstantThreader
from exirc.ir.rewrite import Answer, rewrite_nodes
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def _is_tensor_type(type_name: str) -> bool:
    return type_name in ("Tensor", "Optional[Tensor]")


@dataclass(frozen=True)
class ScalarsToTensors(Pass):
    """Edge -> Edge: numbers passed as Tensor arguments become 0-d constants."""

    name: ClassVar[str] = "scalars_to_tensors"

    def run(self, program: ExportedProgram) -> PassResult:
        root = program.graph_module
        threader = ConstantThreader(root, functools.partial(add_constant, program))
        return PassResult(program, rewrite_nodes(root, functools.partial(_convert, threader)))


def _convert(threader: ConstantThreader, node: Node) -> Answer:
    """Give `node` a constant for each number it passes as a Tensor."""
    target, module = node.target, node.graph.owning_module
    if not isinstance(target, torch._ops.OpOverload):
        return None
    assert module is not None  # set by torch.fx for every graph of a GraphModule
    args = list(node.args)
    changed = False
    for position, argument in enumerate(target._schema.arguments):
        if position >= len(args) or argument.kwarg_only:
            break
        value = args[position]
        if _is_tensor_type(str(argument.type)) and isinstance(value, (bool, int, float)):
            tensor = torch.tensor(value)
            # One constant per distinct number and dtype, in each graph.
            key = f"scalar:{value!r}:{tensor.dtype}"
            args[position] = threader.node_in(module, key, f"_scalar_{node.name}", tensor,
                                              described=f"the number {value!r}")
            changed = True
    if not changed:
        return None
    node.args = tuple(args)
    return node
