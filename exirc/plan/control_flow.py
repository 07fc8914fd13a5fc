"""Control flow in out-variant form: each control-flow op writes into allocs.

Like a kernel call, a control-flow op gets explicit memory for its results
(`outs`), which the memory planner places and the emitter fills:

    cond(pred, t, f, ops)           -> cond_out(pred, t, f, ops, outs)
        a branch's results are moved into `outs`
    map_impl(body, xs, args)        -> map_out(body, xs, args, slices, outs)
        iteration i copies xs[k][i] into slices[k], runs the body, and
        writes its results into row i of `outs`
    while_loop(c, b, carried, add)  -> while_out(c, b, carried, add, outs)
        `outs` hold the loop state: the carried inputs are copied in, `c`
        and `b` read them, and `b`'s results are copied back each iteration

The functions below are those semantics in Python: the compiler never calls
them, but a test (or the verifier) can run an out-variant graph eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx import GraphModule, Node

from exirc.errors import UnsupportedOperatorError
from exirc.ir.control_flow import COND, MAP, WHILE_LOOP, output_values, placeholders, subgraphs
from exirc.ir.source import source_location
from exirc.plan.alias_views import view_base

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


def _results(node: Node) -> list[torch.Tensor]:
    value = node.meta["val"]
    results = list(value) if isinstance(value, (list, tuple)) else [value]
    for result in results:
        if not isinstance(result, torch.Tensor):
            where = source_location(node)
            raise UnsupportedOperatorError(
                f"{node.target} at {where or node.name} returns a {type(result).__name__}; "
                "control flow may only produce tensors",
                hint="return sizes and counters as 0-d tensors (torch.tensor(n))")
    return results


def copy_passthrough_results(body: GraphModule) -> None:
    """Make every result of a loop body a tensor of its own.

    The loop copies result k into state k while state j is still to be read
    for result j; a body returning a state, a view of one (see
    `exirc.plan.alias_views`), or one value twice would read a state already
    overwritten, so such results become clones first.
    """
    output = body.graph.output_node()
    seen: set[Node] = set()
    results = output_values(body)
    for i, result in enumerate(results):
        if isinstance(result, Node) and (view_base(result).op == "placeholder" or
                                         result in seen):
            with body.graph.inserting_before(output):
                clone = body.graph.call_function(torch.ops.aten.clone.default, (result,))
            clone.meta.update(val=result.meta["val"], stack_trace=result.meta.get("stack_trace"))
            results[i] = clone
        if isinstance(result, Node):
            seen.add(result)
    output.args = (tuple(results),)
    body.recompile()


def to_out_form(owner: GraphModule, node: Node,
                make_alloc: Callable[[Node, torch.Tensor], Node]) -> None:
    """Rewrite control-flow `node` (of `owner`) into its out form, in place.

    `make_alloc(before, fake)` inserts an alloc node before `before`.
    """
    outs = [make_alloc(node, fake) for fake in _results(node)]
    target = node.target
    if target is MAP:
        body = subgraphs(owner, node)[0]
        xs = list(node.args[1])  # type: ignore[arg-type]
        slice_placeholders = placeholders(body)[:len(xs)]
        slices = [make_alloc(node, p.meta["val"]) for p in slice_placeholders]
        node.args = (*node.args, slices, outs)
    else:
        node.args = (*node.args, outs)
    node.target = OUT_FORMS[target]  # type: ignore[assignment]


def outs_of(node: Node) -> list[Node]:
    """The alloc nodes an out-form node writes its results into."""
    outs = node.args[-1]
    assert isinstance(outs, (list, tuple))
    return [out for out in outs if isinstance(out, Node)]
