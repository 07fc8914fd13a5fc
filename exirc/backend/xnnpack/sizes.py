"""Dynamic sizes in an XNNPACK payload: upper-bounded dims, and the reshapes
XNNPACK can redo at run time.

ExecuTorch's XNNPACK runtime gives XNNPACK the actual shapes of a
delegate's inputs at each call and lets it propagate them through the
graph (its outputs are then resized). So a payload with dynamic dims is an
ordinary payload whose values carry each dim's upper bound; what XNNPACK
cannot propagate are numbers an operator keeps in its parameters: a
reshape's new shape (where a 0 is the one dim XNNPACK infers from the
input's element count), a slice's sizes (where a 0 is "to the end"), a
constant computed from a size.

The emitters work on plain ints. So a partition with dynamic dims is built
once per size point (every symbol at its upper bound, then at other sizes)
and the graphs are compared (`reconcile`): values keep the
upper-bound dims; a reshape whose new shape differs between points in one
entry gets a 0 there, and so does a slice size that is the whole of a
dynamic dim at every point; anything else that differs means the graph depends on
a size in a way XNNPACK cannot follow, and is refused. `XnnpackSupport`
takes only operators whose emitters stay within that (`support_dynamic`);
the comparison guarantees it.
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TypeVar

import torch

from exirc.serialize.xnnpack import graph as G

_POINT: contextvars.ContextVar[dict[object, int] | None] = contextvars.ContextVar(
    "xnnpack_size_point", default=None)
POINTS = 3  # the upper bounds and two more: what a size flows into differs between them


class SizeMismatch(Exception):
    """The graphs built at two size points differ beyond a reshape's inferred dim."""


def bounds(d: torch.SymInt, symbol: object) -> tuple[int, int]:
    """The range the shape environment of `d` gives `symbol`."""
    rng = d.node.shape_env.var_to_range[symbol]
    return int(rng.lower), int(rng.upper)


def concrete(dims: Sequence[object]) -> list[int]:
    """A shape as ints: dynamic dims at the current size point (their upper
    bounds unless `at_point` chose others)."""
    point = _POINT.get()
    out = []
    for d in dims:
        if isinstance(d, torch.SymInt):
            expr = d.node.expr
            values = {s: (point[s] if point is not None and s in point else bounds(d, s)[1])
                      for s in expr.free_symbols}
            out.append(int(expr.subs(values)))
        else:
            out.append(operator.index(d))  # type: ignore[arg-type]
    return out


def may_be_empty(val: torch.Tensor, lower: dict[object, int]) -> object | None:
    """A dynamic dim of `val` that is 0 with every symbol at its lower bound
    (`lower`: the program's range constraints), else None."""
    for d in val.shape:
        if isinstance(d, torch.SymInt):
            expr = d.node.expr
            if int(expr.subs({s: lower.get(s, 1) for s in expr.free_symbols})) <= 0:
                return d
    return None


def is_dynamic(val: object) -> bool:
    return isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in val.shape)


@contextlib.contextmanager
def at_point(point: dict[object, int]) -> Iterator[None]:
    token = _POINT.set(point)
    try:
        yield
    finally:
        _POINT.reset(token)


def size_points(vals: Iterable[torch.Tensor]) -> list[dict[object, int]]:
    """`POINTS` assignments of the symbols of `vals`: every upper bound (the
    graph that is written), then sizes past the bounds, for comparison only
    (a bound may be 2, leaving no other size in range that is not 1, and a
    dim of 1 changes how the emitters lay values out). Those sizes avoid the
    partition's static sizes and each other, so the graphs differ only where
    a size flows."""
    taken: set[int] = {1}
    uppers: dict[object, int] = {}
    for val in vals:
        for d in val.shape:
            if isinstance(d, torch.SymInt):
                for symbol in d.node.expr.free_symbols:
                    uppers[symbol] = bounds(d, symbol)[1]
            else:
                taken.add(int(d))
    if not uppers:
        return []
    points = [dict(uppers)]
    taken |= set(uppers.values())
    for _ in range(POINTS - 1):
        point = {}
        for symbol, upper in uppers.items():
            size = upper + 1
            while size in taken:
                size += 1
            point[symbol] = size
            taken.add(size)
        points.append(point)
    return points


def reconcile(graphs: Sequence[G.XNNGraph]) -> G.XNNGraph:
    """The first graph (built at the upper bounds), its reshapes' varying
    entries made 0; SizeMismatch where the graphs differ otherwise."""
    first = graphs[0]
    for other in graphs[1:]:
        if len(other.values) != len(first.values) or len(other.nodes) != len(first.nodes):
            raise SizeMismatch("the graph has a different number of values or nodes at "
                               "another size")
        for a, b in zip(first.values, other.values):
            if replace(a, dims=[]) != replace(b, dims=[]) or len(a.dims) != len(b.dims):
                raise SizeMismatch(f"value {a.id_out} changes kind or rank with the size")
        if first.constant_data != other.constant_data:
            raise SizeMismatch("a constant is computed from a dynamic size")
    nodes = [_node(first.nodes[i], [g.nodes[i] for g in graphs[1:]], graphs)
             for i in range(len(first.nodes))]
    return replace(first, nodes=nodes)


def _node(node: G.Node, others: list[G.Node], graphs: Sequence[G.XNNGraph]) -> G.Node:
    if all(o == node for o in others):
        return node
    if any(o.kind != node.kind for o in others):
        raise SizeMismatch(f"a {node.kind.name} node changes kind with the size")
    if node.kind == G.NodeKind.STATIC_SLICE:
        return replace(node, params=_slice(_params(G.StaticSlice, node, others), graphs))
    if node.kind == G.NodeKind.STATIC_RESHAPE:
        return replace(node, params=_reshape(_params(G.StaticReshape, node, others)))
    raise SizeMismatch(f"the parameters of a {node.kind.name} node depend on a dynamic size")


P = TypeVar("P")


def _params(kind: type[P], node: G.Node, others: list[G.Node]) -> list[P]:
    """The parameters of one node as built at each size point."""
    found = [n.params for n in (node, *others)]
    assert all(isinstance(p, kind) for p in found)
    return found  # type: ignore[return-value]


def _reshape(at: list[G.StaticReshape]) -> G.StaticReshape:
    """A reshape whose new shape varies in one entry: 0 there (inferred)."""
    first = list(at[0].new_shape)
    varying = [i for i, d in enumerate(first) if any(p.new_shape[i] != d for p in at)]
    shape = [0 if i in varying else d for i, d in enumerate(first)]
    same = replace(at[0], new_shape=shape)
    if len(varying) == 1 and 0 not in first \
            and all(replace(p, new_shape=shape) == same for p in at):
        return same
    raise SizeMismatch(f"a reshape to {first} has {len(varying)} dims that vary with the "
                       "size; XNNPACK infers one")


def _slice(at: list[G.StaticSlice], graphs: Sequence[G.XNNGraph]) -> G.StaticSlice:
    """A slice that takes a dynamic dim whole (offset 0, size the input's dim at
    every point): size 0 there, which XNNPACK reads as "to the end"."""
    sizes = list(at[0].sizes)
    for i, size in enumerate(at[0].sizes):
        if all(p.sizes[i] == size for p in at):
            continue
        if not all(p.offsets[i] == 0 and p.sizes[i] == g.values[p.input_id].dims[i]
                   for p, g in zip(at, graphs)):
            raise SizeMismatch("a slice's bounds depend on a dynamic size")
        sizes[i] = 0
    same = replace(at[0], sizes=sizes)
    if any(replace(p, sizes=sizes) != same for p in at):
        raise SizeMismatch("a slice's offsets depend on a dynamic size")
    return same
