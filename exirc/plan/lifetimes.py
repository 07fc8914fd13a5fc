"""Which tensors of an out-variant graph need planned memory, how big, and when.

A planned tensor is a user input (live from position 0) or the tensor an
`alloc` node marks. Every other tensor-valued node is an alias of planned
tensors, and a use of an alias is a use of what it aliases:

    out-variant or in-place op   the arguments it writes and returns
                                 (`out=`, or `values=`/`indices=`, ...)
    getitem(op, i)               the i-th of those
    view op (caller's set)       its first argument

Parameters, buffers and constants are not planned. The `output` node is the
last node, so what it returns stays live to the end.

    lifetime = [index of the defining node, index of the last use], inclusive
    nbytes   = numel * element size, each symbolic dim at its upper bound
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import torch
from torch.fx import Graph, Node

from exirc.errors import InternalError, ModelError
from exirc.plan.alloc import is_alloc

SizeBound = Callable[[torch.SymInt], int | None]


@dataclass(frozen=True)
class Lifetime:
    """A planned tensor: its defining node, size, and the positions it is live."""

    node: Node
    nbytes: int
    start: int
    end: int

    def overlaps(self, other: Lifetime) -> bool:
        return self.start <= other.end and other.start <= self.end


class UnboundedShapeError(ModelError):
    """A planned tensor has a dynamic dimension with no upper bound."""

    code = "E0311"


def tensor_lifetimes(
    graph: Graph,
    user_inputs: Collection[str],
    *,
    view_ops: Collection[object] = frozenset(),
    size_bound: SizeBound | None = None,
) -> list[Lifetime]:
    """The planned tensors of `graph` in definition order, with sizes and lifetimes.

    `user_inputs` names the placeholders that are user inputs; `view_ops` are
    targets whose result aliases their first argument; `size_bound(dim)` gives
    the upper bound of a symbolic dim (default: its shape environment's range).
    """
    bound = size_bound if size_bound is not None else shape_env_bound
    start: dict[Node, int] = {}
    end: dict[Node, int] = {}
    bases: dict[Node, tuple[Node, ...]] = {}
    for index, node in enumerate(graph.nodes):
        for used in node.all_input_nodes:
            for base in bases[used]:
                if base in end:
                    end[base] = index
        bases[node] = _bases(node, bases, view_ops)
        if _is_planned(node, user_inputs):
            start[node] = 0 if node.op == "placeholder" else index
            end[node] = index
    return [Lifetime(node, _nbytes(node, bound), start[node], end[node]) for node in start]


def _is_planned(node: Node, user_inputs: Collection[str]) -> bool:
    if is_alloc(node):
        return True
    if node.op != "placeholder" or node.name not in user_inputs:
        return False
    # A user input that is a number (int, SymInt) is not planned; one with no
    # metadata is, and _nbytes reports it.
    value = node.meta.get("val")
    return value is None or isinstance(value, torch.Tensor)


def _bases(
    node: Node, bases: dict[Node, tuple[Node, ...]], view_ops: Collection[object]
) -> tuple[Node, ...]:
    """The tensors `node` stands for, one per output: itself unless it aliases."""
    if node.op != "call_function":
        return (node,)
    if node.target in view_ops and isinstance(node.args[0], Node):
        return bases[node.args[0]]
    if node.target is operator.getitem:
        source, i = node.args
        if isinstance(source, Node) and isinstance(i, int) and i < len(bases[source]):
            return (bases[source][i],)
        return (node,)
    if isinstance(node.target, torch._ops.OpOverload):
        written = _written_outputs(node, node.target._schema)
        if written:
            return tuple(base for arg in written for base in bases[arg])
    return (node,)


def _written_outputs(node: Node, schema: torch._C.FunctionSchema) -> list[Node]:
    """The arguments an op writes and returns, in the order of its results.

    An op whose results do not name them (`-> ()`, as with TensorList outs)
    stands for all the arguments it writes, in order.
    """
    written: dict[frozenset[str], list[Node]] = {}
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            positional = not arg.kwarg_only and i < len(node.args)
            value = node.args[i] if positional else node.kwargs.get(arg.name)
            written[frozenset(arg.alias_info.before_set)] = list(_nodes(value))
    returned = [
        written.get(frozenset(ret.alias_info.before_set), [])
        for ret in schema.returns
        if ret.alias_info is not None
    ]
    groups = returned if returned else list(written.values())
    return [value for group in groups for value in group]


def _nodes(value: object) -> Iterable[Node]:
    if isinstance(value, Node):
        yield value
    elif isinstance(value, (list, tuple)):
        yield from (v for v in value if isinstance(v, Node))


def _nbytes(node: Node, bound: SizeBound) -> int:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise InternalError(f"planned tensor %{node.name} has no tensor in meta['val']")
    numel = 1
    for dim in value.shape:
        upper = bound(dim) if isinstance(dim, torch.SymInt) else int(dim)
        if upper is None:
            raise _unbounded(node, dim, tuple(value.shape))
        numel *= upper
    return numel * value.dtype.itemsize


def shape_env_bound(dim: torch.SymInt) -> int | None:
    """The upper bound of a symbolic dim from its shape environment, None if unbounded."""
    shape_env = dim.node.shape_env
    if shape_env is None:
        return None
    upper = shape_env.bound_sympy(dim.node.expr).upper
    return int(upper) if upper.is_Integer else None  # int_oo when unbounded


def _unbounded(node: Node, dim: torch.SymInt, shape: tuple[object, ...]) -> ModelError:
    shape_text = ", ".join(str(d) for d in shape)
    return UnboundedShapeError(
        f"tensor %{node.name} of shape ({shape_text}) needs planned memory, but dimension "
        f"{dim} has no upper bound; give it one when exporting: "
        'torch.export.Dim("name", max=N) in dynamic_shapes for an input dimension, '
        "torch._check(size <= N) in the model for a data-dependent one",
        hint='bound every dynamic dimension, e.g. torch.export.Dim("batch", max=64)',
    )
