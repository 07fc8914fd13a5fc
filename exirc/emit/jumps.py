"""Control flow -> instruction ranges selected by `JumpFalseCall`.

A `JumpFalseCall` jumps to its destination when its condition is false; one
whose condition is a constant False value is an unconditional jump. With
those, an out-form control-flow node (see `exirc.plan.ops`) becomes
its subgraphs inlined between jumps, the layouts ExecuTorch's runtime runs:

    cond_out                          map_out
      jump_false pred -> ELSE           n = sym_size(xs[0], 0)
      <true branch>                   LOOP:
      move results -> outs              select_copy(xs[k], 0, i, out=slices[k])
      jump_false False -> END           <body>
    ELSE:                               et_copy_index(outs[j], result j, i)
      <false branch>                    i = i + 1
      move results -> outs              done = i == n
    END:                                jump_false done -> LOOP
                                        i = i - i       (ready for the next run)

    while_out
      clone(carried[k], out=outs[k])
    LOOP:
      <cond graph on outs>
      jump_false pred -> END
      <body graph on outs>
      clone(result k, out=outs[k])
      jump_false False -> LOOP
    END:

ExecuTorch's emitter refuses `while_loop`; this layout uses only portable
kernels, so such programs run on its runtime too. A loop body runs at least
once per entry to `map`, as in ExecuTorch: `map` over zero rows is refused
by torch.export already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.fx import GraphModule, Node

from exirc.plan.ops import cond_out, map_out, out_form_subgraphs, outs_of
from exirc.serialize import program as P

if TYPE_CHECKING:
    from exirc.emit.method import MethodEmitter


def emit_control_flow(emitter: MethodEmitter, node: Node) -> None:
    owner = node.graph.owning_module
    assert isinstance(owner, GraphModule)
    modules = out_form_subgraphs(owner, node)
    outs = [emitter.table.node_value(out) for out in outs_of(node)]
    if node.target is cond_out:
        _cond(emitter, node, modules, outs)
    elif node.target is map_out:
        _map(emitter, node, modules[0], outs)
    else:
        _while(emitter, node, modules, outs)
    emitter.table.of_node[node] = outs


def _values(emitter: MethodEmitter, items: Any) -> list[int]:
    return [emitter.operand(item) for item in items]


def _patch_jump(emitter: MethodEmitter, at: int, destination: int) -> None:
    jump = emitter.instructions[at]
    assert isinstance(jump, P.JumpFalseCall)
    emitter.instructions[at] = P.JumpFalseCall(jump.cond_value_index, destination)


def _cond(emitter: MethodEmitter, node: Node, branches: list[GraphModule],
          outs: list[int]) -> None:
    pred = emitter.operand(node.args[0])
    operands = _values(emitter, node.args[3])
    to_else = emitter.append(P.JumpFalseCall(pred, -1), node)
    to_end = -1
    for which, branch in enumerate(branches):
        if which == 1:
            _patch_jump(emitter, to_else, len(emitter.instructions))
        for result, out in zip(emitter.subgraph(branch, operands, node), outs):
            emitter.append(P.MoveCall(result, out), node)
        if which == 0:
            to_end = emitter.append(P.JumpFalseCall(emitter.false_value(), -1), node)
    _patch_jump(emitter, to_end, len(emitter.instructions))


def _map(emitter: MethodEmitter, node: Node, body: GraphModule, outs: list[int]) -> None:
    _, xs_nodes, args, slice_nodes, _ = node.args
    xs = _values(emitter, xs_nodes)
    slices = _values(emitter, slice_nodes)
    table = emitter.table
    for out in outs:
        # et_copy_index grows the result row by row, which the runtime allows
        # only for a tensor that declares a bounded dynamic shape.
        tensor = table.values[out]
        assert isinstance(tensor, P.Tensor)
        tensor.shape_dynamism = P.TensorShapeDynamism.DYNAMIC_BOUND
    rows = table.add(P.Int(0))
    emitter.kernel("aten::sym_size", "int", [xs[0], table.add(P.Int(0)), rows], node)
    index = table.add(P.Int(0))
    loop = len(emitter.instructions)
    for x, slice_ in zip(xs, slices):
        emitter.kernel("aten::select_copy", "int_out",
                       [x, table.add(P.Int(0)), index, slice_, slice_], node)
    results = emitter.subgraph(body, [*slices, *_values(emitter, args)], node)
    for result, out in zip(results, outs):
        emitter.kernel("executorch_prim::et_copy_index", "tensor", [out, result, index], node)
    emitter.kernel("executorch_prim::add", "Scalar", [index, table.add(P.Int(1)), index], node)
    done = table.add(P.Bool(False))
    emitter.kernel("executorch_prim::eq", "Scalar", [index, rows, done], node)
    emitter.append(P.JumpFalseCall(done, loop), node)
    emitter.kernel("executorch_prim::sub", "Scalar", [index, index, index], node)


def _while(emitter: MethodEmitter, node: Node, graphs: list[GraphModule],
           outs: list[int]) -> None:
    cond_graph, body_graph = graphs
    _, _, carried, additional, _ = node.args
    for value, out in zip(_values(emitter, carried), outs):
        _clone(emitter, value, out, node)
    state = [*outs, *_values(emitter, additional)]
    loop = len(emitter.instructions)
    (pred,) = emitter.subgraph(cond_graph, state, node)
    to_end = emitter.append(P.JumpFalseCall(pred, -1), node)
    for result, out in zip(emitter.subgraph(body_graph, state, node), outs):
        _clone(emitter, result, out, node)
    emitter.append(P.JumpFalseCall(emitter.false_value(), loop), node)
    _patch_jump(emitter, to_end, len(emitter.instructions))


def _clone(emitter: MethodEmitter, source: int, out: int, node: Node) -> None:
    no_format = emitter.table.add(P.Null())
    emitter.kernel("aten::clone", "out", [source, no_format, out, out], node)
