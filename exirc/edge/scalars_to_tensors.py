"""Scalars to tensors: the Edge dialect has no scalars on tensor edges.

After decomposition, ops such as `aten.mul.Tensor(x, 0.35)` carry a Python
number where the schema says Tensor (torch wraps it at run time). Kernels
of the Edge dialect take tensors there, so the number becomes a 0-d
constant tensor. A 0-d tensor promotes like the wrapped number it replaces
(it never widens a tensor of the same category), so results are unchanged.

A size computed at run time (a SymInt of a dynamic dim: `pos.add_(seq_len)` in
transformers' static cache) cannot be a constant: `aten.scalar_tensor` makes
the 0-d tensor from it when the method runs, as ExecuTorch's edge passes do.
Left as it is, the SymInt reached the file as an Int where the kernel reads a
Tensor, which both runtimes refuse.
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


# The dtype torch gives a symbolic number when it wraps it in a tensor.
_SYMBOLIC_DTYPES = {torch.SymBool: torch.bool, torch.SymInt: torch.int64,
                    torch.SymFloat: torch.float32}


def _category(dtype: torch.dtype) -> int:
    if dtype.is_complex:
        return 3
    return 2 if dtype.is_floating_point else 0 if dtype == torch.bool else 1


def _symbolic_dtype(user: Node, value: object) -> torch.dtype | None:
    """The dtype of the 0-d tensor for a node computing a SymInt/SymFloat/SymBool
    (None for anything else).

    A wrapped number never widens its tensor operands, but a 0-d tensor widens
    other 0-d tensors (an int32 0-d plus an int64 0-d is int64). The user's own
    result dtype, when the number's category fits in it, promotes to that
    result whatever the operands' dims; a comparison's bool result says nothing
    about its operands, so it gets torch's dtype for the number."""
    if not isinstance(value, Node):
        return None
    wrapped = _SYMBOLIC_DTYPES.get(type(value.meta.get("val")))
    result = user.meta.get("val")
    if (wrapped is not None and isinstance(result, torch.Tensor) and result.dtype != torch.bool
            and _category(result.dtype) >= _category(wrapped)):
        return result.dtype
    return wrapped


def _tensor_at_run_time(user: Node, value: Node, dtype: torch.dtype) -> Node:
    """`aten.scalar_tensor(value)`, before `user`: the 0-d tensor of a run-time number."""
    with user.graph.inserting_before(user):
        node = user.graph.call_function(torch.ops.aten.scalar_tensor.default, (value,),
                                        {"dtype": dtype})
    fake = next((a.meta["val"] for a in user.all_input_nodes
                 if isinstance(a.meta.get("val"), torch.Tensor)), None)
    mode = getattr(fake, "fake_mode", None) or getattr(user.meta.get("val"), "fake_mode", None)
    node.meta["val"] = (torch.empty((), dtype=dtype) if mode is None
                        else mode.from_tensor(torch.empty((), dtype=dtype), static_shapes=True))
    node.meta["stack_trace"] = user.meta.get("stack_trace")
    return node


@dataclass(frozen=True)
class ScalarsToTensors(Pass):
    """Edge -> Edge: numbers passed as Tensor arguments become 0-d constants."""

    name: ClassVar[str] = "scalars_to_tensors"

    def run(self, program: ExportedProgram) -> PassResult:
        root = program.graph_module
        threader = ConstantThreader(root, functools.partial(add_constant, program))
        return PassResult(program, rewrite_nodes(root, functools.partial(_convert, threader)))


def _convert(threader: ConstantThreader, node: Node) -> Answer:
    """Give `node` a constant for each number it passes as a Tensor, and a run-time
    0-d tensor for each symbolic number."""
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
        dtype = _symbolic_dtype(node, value) if _is_tensor_type(str(argument.type)) else None
        if dtype is not None and isinstance(value, Node):  # a Node: _symbolic_dtype checked
            args[position] = _tensor_at_run_time(node, value, dtype)
            changed = True
        elif _is_tensor_type(str(argument.type)) and isinstance(value, (bool, int, float)):
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
