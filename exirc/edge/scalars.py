"""Scalars to tensors: the Edge dialect has no scalars on tensor edges.

After decomposition, ops such as `aten.mul.Tensor(x, 0.35)` carry a Python
number where the schema says Tensor (torch wraps it at run time). Kernels
of the Edge dialect take tensors there, so the number becomes a 0-d
constant tensor. A 0-d tensor promotes like the wrapped number it replaces
(it never widens a tensor of the same category), so results are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.fx import GraphModule, Node

from exirc.control_flow import add_operand, is_control_flow, subgraphs
from exirc.edge.constants import add_constant
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
        def top_level_constant(name: str, value: torch.Tensor) -> Node:
            return add_constant(program, name, value)

        return PassResult(program, _convert(program.graph_module, top_level_constant))


ConstantMaker = Callable[[str, torch.Tensor], Node]


def _convert(module: GraphModule, make_constant: ConstantMaker) -> bool:
    """Convert the scalars of `module` and its subgraphs; whether any changed.

    `make_constant(name, tensor)` returns a node of `module` holding the
    constant. In a subgraph that node is a placeholder threaded through
    the control-flow op from the parent's constant.
    """
    changed = False
    for node in list(module.graph.nodes):
        if is_control_flow(node):
            changed |= _convert_subgraphs(module, node, make_constant)
            continue
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        args = list(node.args)
        for position, argument in enumerate(target._schema.arguments):
            if position >= len(args) or argument.kwarg_only:
                break
            value = args[position]
            if _is_tensor_type(str(argument.type)) and isinstance(value, (bool, int, float)):
                name = f"_scalar_{node.name}_{argument.name}"
                args[position] = make_constant(name, torch.tensor(value))
                changed = True
        node.args = tuple(args)
    if changed:
        module.recompile()
    return changed


def _convert_subgraphs(owner: GraphModule, node: Node, make_constant: ConstantMaker) -> bool:
    threaded: dict[str, list[Node]] = {}  # one placeholder per subgraph of `node`

    def maker_for(index: int) -> ConstantMaker:
        def make(name: str, value: torch.Tensor) -> Node:
            # Branches may both have a `mul`; the key tells their scalars apart.
            key = f"{name}={value.item()!r}:{value.dtype}"
            if key not in threaded:
                threaded[key] = add_operand(owner, node, make_constant(name, value))
            return threaded[key][index]
        return make

    changed = False
    for index, module in enumerate(subgraphs(owner, node)):
        changed |= _convert(module, maker_for(index))
    if threaded:
        owner.recompile()
    return changed
