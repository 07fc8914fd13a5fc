"""Views that cost nothing: a reshape of a planned tensor is the same bytes.

The Edge dialect turns every view into a copy (`view_copy`, `squeeze_copy`,
...) so each op has an out-variant. For a contiguous planned tensor of fixed
shape, though, the copy's result has exactly the bytes of its input: it can
be a second tensor value over the input's memory, with no instruction and
no memory of its own. The memory planner keeps the input live while the
view is (it is a view op to the planner), and the emitter gives the view
the input's place in the arena.

Only views whose shapes are static qualify (a dynamic view's shape is set
when it runs, so it needs its instruction), and only of planned tensors:
results of ops, the method's inputs, and what a subgraph receives that is
planned (a map's row, a loop's state, an operand planned by the parent),
never constants. A loop body's result that views its state is copied
before the state is overwritten (`copy_passthrough_results`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.fx import GraphModule, Node

from exirc.ir.control_flow import (
    graph_modules,
    is_control_flow,
    placeholders,
    subgraphs,
    whole_operands,
)
from exirc.ir.rewrite import Answer, rewrite_nodes
from exirc.passes.contract import Pass, PassResult
from exirc.plan.ops import alias_view

if TYPE_CHECKING:
    from torch.export import ExportedProgram

aten = torch.ops.aten
_SAME_BYTES = frozenset({
    aten.view_copy.default, aten.squeeze_copy.default, aten.squeeze_copy.dim,
    aten.squeeze_copy.dims, aten.unsqueeze_copy.default, aten.alias_copy.default,
})


def _static(value: object) -> bool:
    return isinstance(value, torch.Tensor) and all(isinstance(d, int) for d in value.shape)


@dataclass(frozen=True)
class AliasViews(Pass):
    """Edge/Backend -> same, with static reshapes of planned tensors as `alias_view`.

    Run before `to_out_variants`: the aliased views get no out-variant and no
    `alloc`; `memory_plan` treats them as views of their input.
    """

    name: ClassVar[str] = "alias_views"

    def run(self, program: ExportedProgram) -> PassResult:
        from torch.export.graph_signature import InputKind

        user_inputs = {spec.arg.name for spec in program.graph_signature.input_specs
                       if spec.kind == InputKind.USER_INPUT}
        root = program.graph_module
        rule = functools.partial(_alias, _received(root), user_inputs)
        return PassResult(program, rewrite_nodes(root, rule))


def _alias(received: Received, user_inputs: set[str], node: Node) -> Answer:
    if node.target not in _SAME_BYTES or not _aliasable(node, received, user_inputs):
        return None
    shape = [int(d) for d in node.meta["val"].shape]
    node.target = alias_view
    node.args, node.kwargs = (node.args[0], shape), {}
    return node


# A subgraph placeholder -> the parent's operand it receives, or None when it
# receives memory the control-flow op plans itself (a map's row, a loop state).
Received = dict[Node, Node | None]


def _received(root: GraphModule) -> Received:
    received: Received = {}
    for module in graph_modules(root):
        for node in module.graph.nodes:
            if is_control_flow(node):
                for sub, operands in zip(subgraphs(module, node), whole_operands(node)):
                    for placeholder, operand in zip(placeholders(sub), operands):
                        received[placeholder] = operand if isinstance(operand, Node) else None
    return received


def _aliasable(node: Node, received: Received, user_inputs: set[str]) -> bool:
    source = node.args[0]
    if not isinstance(source, Node) or not _static(node.meta.get("val")) or \
            not _static(source.meta.get("val")):
        return False
    if source.meta["val"].dtype != node.meta["val"].dtype:
        return False
    return _planned(source, received, user_inputs)


def _planned(node: Node, received: Received, user_inputs: set[str]) -> bool:
    """Whether `node` is a tensor with planned memory (not a constant)."""
    while True:
        if node.op == "call_function" and node.target is alias_view:
            node = node.args[0]  # type: ignore[assignment]
        elif node.op == "placeholder" and node in received:
            operand = received[node]
            if operand is None:
                return True
            node = operand
        else:
            break
    if node.op == "placeholder":
        return node.name in user_inputs  # else a parameter, buffer or constant
    return node.op == "call_function"  # an op's result: planned once it has outs
