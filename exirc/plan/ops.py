"""The ops of the out-variant form, the graph form planning works on and emit reads.

After `to_out_variants`, every call writes into memory it is given:

    kernels        `aten.add.out(x, y, out=%alloc)`: the op's out-variant overload
                   (`out_variant`); a backend op carries its own; a custom op with
                   none is called functionally into its out (`functional_ops`)
    alloc          `%alloc = alloc(((2, 16), torch.float32))`: one planned tensor.
                   The planner reads its shape and dtype from `meta["val"]` (a
                   FakeTensor whose dims may be symbolic), never from the
                   argument; the compiler never calls it, a test running the graph
                   eagerly gets an empty tensor of that shape
    alias_view     a static reshape of a planned tensor: the same bytes, no
                   instruction (made by `alias_views`)
    control flow   each control-flow op writes its results into allocs (`outs`),
                   which the memory planner places and the emitter fills:

        cond(pred, t, f, ops)           -> cond_out(pred, t, f, ops, outs)
            a branch's results are moved into `outs`
        map_impl(body, xs, args)        -> map_out(body, xs, args, slices, outs)
            iteration i copies xs[k][i] into slices[k], runs the body, and
            writes its results into row i of `outs`
        while_loop(c, b, carried, add)  -> while_out(c, b, carried, add, outs)
            `outs` hold the loop state: the carried inputs are copied in, `c`
            and `b` read them, and `b`'s results are copied back each iteration

The functions below are those semantics in Python. The form's verifier is
`exirc.plan.verify`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import GraphModule, Node

from exirc.backend.llama_ops import out_form as llama_out_form
from exirc.backend.ops import BackendOp
from exirc.backend.quantized_ops import out_form as quantized_out_form
from exirc.edge.ops import is_custom_op
from exirc.ir.control_flow import COND, MAP, WHILE_LOOP
from exirc.plan.functional_ops import functional_call

AllocSpec = tuple[tuple[int, ...], torch.dtype]


def alloc(spec: AllocSpec) -> torch.Tensor:
    """Memory for one tensor of `spec = (shape, dtype)`."""
    shape, dtype = spec
    return torch.empty(shape, dtype=dtype)


def is_alloc(node: Node) -> bool:
    return node.op == "call_function" and node.target is alloc


def alias_view(tensor: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """`tensor` seen with `shape`: same memory, no copy."""
    return tensor.view(shape)


def view_base(node: Node) -> Node:
    """What an alias_view chain ends at."""
    while node.op == "call_function" and node.target is alias_view:
        node = node.args[0]  # type: ignore[assignment]
    return node


Tensors = Sequence[torch.Tensor]


def _flat(results: Any) -> list[torch.Tensor]:
    return list(results) if isinstance(results, (list, tuple)) else [results]


def _write(outs: Tensors, results: Any) -> list[torch.Tensor]:
    for out, result in zip(outs, _flat(results)):
        out.resize_(result.shape).copy_(result)
    return list(outs)


def cond_out(pred: Any, true_fn: Callable[..., Any], false_fn: Callable[..., Any],
             operands: Sequence[Any], outs: Tensors) -> list[torch.Tensor]:
    """torch.cond, writing the taken branch's results into `outs`."""
    return _write(outs, (true_fn if bool(pred) else false_fn)(*operands))


def map_out(body: Callable[..., Any], xs: Tensors, args: Sequence[Any],
            slices: Tensors, outs: Tensors) -> list[torch.Tensor]:
    """map over dim 0 of `xs`, stacking the body's results into `outs`."""
    rows = xs[0].shape[0]
    for out in outs:
        out.resize_((rows, *out.shape[1:]))
    for i in range(rows):
        for slice_, x in zip(slices, xs):
            slice_.copy_(x[i])
        for out, result in zip(outs, _flat(body(*slices, *args))):
            out[i].copy_(result)
    return list(outs)


def while_out(cond_fn: Callable[..., Any], body_fn: Callable[..., Any],
              carried: Tensors, additional: Sequence[Any],
              outs: Tensors) -> list[torch.Tensor]:
    """while_loop with its state in `outs`."""
    _write(outs, list(carried))
    while bool(cond_fn(*outs, *additional)):
        _write(outs, body_fn(*outs, *additional))
    return list(outs)


OUT_FORMS = {COND: cond_out, MAP: map_out, WHILE_LOOP: while_out}
OUT_FORM_OPS = frozenset(OUT_FORMS.values())


def node_list(value: Any) -> list[Any]:
    """An argument that is a list of operands, as a list."""
    assert isinstance(value, (list, tuple)), value
    return list(value)


def is_out_form(node: Node) -> bool:
    return node.op == "call_function" and node.target in OUT_FORM_OPS


def out_form_subgraphs(owner: GraphModule, node: Node) -> list[GraphModule]:
    """The subgraphs of an out-form node, in argument order."""
    count = 2 if node.target in (cond_out, while_out) else 1
    start = 1 if node.target is cond_out else 0
    attrs = [a for a in node.args[start:start + count] if isinstance(a, Node)]
    return [getattr(owner, str(attr.target)) for attr in attrs]


def outs_of(node: Node) -> list[Node]:
    """The alloc nodes an out-form node writes its results into."""
    outs = node.args[-1]
    assert isinstance(outs, (list, tuple))
    return [out for out in outs if isinstance(out, Node)]


# Where a tensor is made and how it is laid out: an out-variant takes none of
# these, because the out tensor it is given already decides them.
_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})


def _signature(schema: torch._C.FunctionSchema) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in schema.arguments
            if not a.is_out and a.name not in _TENSOR_OPTIONS]


def out_variant(target: Any) -> Any:
    """The out-variant of a call target, or None if it has none.

    A backend op carries its out-variant schema, so it is its own. A custom
    op with no out overload is called functionally into planned memory
    (`exirc.plan.functional_ops`).
    """
    if isinstance(target, BackendOp):
        return target if target.out_names else None
    quantized = quantized_out_form(target)  # Q/DQ ops: ExecuTorch's quantized library
    if quantized is not None:
        return quantized
    llama = llama_out_form(target)  # ExecuTorch's LLM attention
    if llama is not None:
        return llama
    found = _aten_out_variant(target)
    if found is None and is_custom_op(target):
        return functional_call(target)
    return found


@functools.cache
def _aten_out_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload of `op`'s packet taking the same arguments plus outs."""
    if any(a.is_out for a in op._schema.arguments):
        return op  # already an out-variant
    wanted = _signature(op._schema)
    packet = op.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        schema = candidate._schema
        if any(a.is_out for a in schema.arguments) and _signature(schema) == wanted:
            return candidate
    return None
