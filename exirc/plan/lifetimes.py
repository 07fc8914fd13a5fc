"""Which tensors of an out-variant graph need planned memory, how big, and when.

A planned tensor is a user input (live from position 0) or the tensor an
`alloc` node marks. Every other tensor-valued node is an alias of planned
tensors, and a use of an alias is a use of what it aliases:

    out-variant or in-place op   the arguments it writes and returns
    (ATen or backend op)         (`out=`, or `values=`/`indices=`, ...)
    getitem(op, i)               the i-th of those
    view op (caller's set)       its first argument

Parameters, buffers and constants are not planned. The `output` node is the
last node, so what it returns stays live to the end. A use of an op's tensor
result that aliases nothing planned is an InternalError: the walk missed an
alias, and a lifetime that ends too soon is a plan that overwrites live data.

Positions follow the order the emitter lays instructions out: a control-flow
node, then its subgraphs one after the other, then what follows it. So the
two branches of a `cond` can share memory (only one runs), and a tensor
from before a loop that the loop reads stays live to the loop's end, since
every iteration reads it again. A subgraph's placeholders stand for the
operands they receive; a `cond` result keeps its branches' results live
too, because moving a tensor aliases it on ExecuTorch's runtime.

    lifetime = [position of the defining node, position of the last use], inclusive
    nbytes   = numel * element size, each symbolic dim at its upper bound
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import torch
from torch.fx import Graph, GraphModule, Node

from exirc.errors import InternalError, ModelError
from exirc.ir.control_flow import output_values, placeholders
from exirc.plan.ops import (
    cond_out,
    is_alloc,
    is_out_form,
    map_out,
    node_list,
    out_form_subgraphs,
    outs_of,
)

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
    walk = _Walk(view_ops)
    for node in graph.nodes:
        if node.op == "placeholder" and _is_planned(node, user_inputs):
            walk.start[node] = 0
        walk.node(node)
    walk.keep_moved_results_live()
    return [Lifetime(node, _nbytes(node, bound), walk.start[node], walk.end[node])
            for node in walk.start]


class _Walk:
    """Positions and uses over a graph and its subgraphs, in emission order."""

    def __init__(self, view_ops: Collection[object]) -> None:
        self.view_ops = view_ops
        self.position = -1
        self.start: dict[Node, int] = {}
        self.end: dict[Node, int] = {}
        self.bases: dict[Node, tuple[Node, ...]] = {}
        # (branch result bases, cond out): the out may alias those results.
        self.moved: list[tuple[tuple[Node, ...], Node]] = []

    def step(self) -> int:
        self.position += 1
        return self.position

    def use(self, nodes: Iterable[Node], position: int) -> None:
        for used in nodes:
            for base in self.bases[used]:
                if base in self.start:
                    self.end[base] = max(self.end.get(base, position), position)
                elif _unresolved_tensor(base):
                    raise _unresolved(base)

    def node(self, node: Node) -> None:
        position = self.step()
        self.use(node.all_input_nodes, position)
        self.bases[node] = _bases(node, self.bases, self.view_ops)
        if is_alloc(node):
            self.start[node] = position
        if node in self.start:
            self.end[node] = max(self.end.get(node, position), position)
        if is_out_form(node):
            self.control_flow(node)

    def subgraph(self, module: GraphModule, operands: list[object]) -> list[Node]:
        """Walk `module` with its placeholders bound to `operands`; its results."""
        for placeholder, operand in zip(placeholders(module), operands):
            self.bases[placeholder] = self.bases[operand] if isinstance(operand, Node) else ()
        for node in module.graph.nodes:
            if node.op != "placeholder":
                self.node(node)
        return [r for r in output_values(module) if isinstance(r, Node)]

    def control_flow(self, node: Node) -> None:
        owner = node.graph.owning_module
        assert owner is not None
        modules = out_form_subgraphs(owner, node)
        outs = outs_of(node)
        if node.target is cond_out:
            operands = node_list(node.args[3])
            for branch in modules:
                results = self.subgraph(branch, operands)
                self.use([*results, *outs], self.step())  # the moves into outs
                for result, out in zip(results, outs):
                    self.moved.append((self.bases[result], out))
            return
        loop_start = self.position + 1
        if node.target is map_out:
            xs, args, slices = (node_list(a) for a in node.args[1:4])
            self.use([*xs, *slices], self.step())  # the select_copy of row i
            results = self.subgraph(modules[0], [*slices, *args])
        else:
            state = [*outs, *node_list(node.args[3])]
            self.use(self.subgraph(modules[0], state), self.step())  # the jump
            results = self.subgraph(modules[1], state)
        self.use([*results, *outs], self.step())  # results into outs
        self.extend_through_loop(loop_start, self.step())  # the back edge

    def extend_through_loop(self, loop_start: int, loop_end: int) -> None:
        """What was live before the loop and is read in it, lives through it."""
        for base, first in self.start.items():
            if first < loop_start <= self.end.get(base, -1):
                self.end[base] = max(self.end[base], loop_end)

    def keep_moved_results_live(self) -> None:
        for results, out in self.moved:
            for base in results:
                if base in self.start:
                    self.end[base] = max(self.end[base], self.end[out])


def _unresolved_tensor(node: Node) -> bool:
    """An op's tensor result that is not planned and aliases nothing planned.

    In out-variant form every op writes into planned memory, so such a result
    means the walk missed what it aliases (an op whose outs it cannot see, a
    view op it was not told of): failing beats a lifetime that ends too soon.
    """
    return node.op == "call_function" and isinstance(node.meta.get("val"), torch.Tensor)


def _unresolved(node: Node) -> InternalError:
    return InternalError(
        f"cannot tell which planned memory %{node.name} ({node.target}) is in: its result "
        "is not an out argument or a view the planner knows of, so its uses would not "
        "keep that memory live")


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
    if is_out_form(node):
        return tuple(base for out in outs_of(node) for base in bases[out])
    # Any call target with a schema: ATen overloads and backend ops alike (the
    # emitter gives both the memory of their outs), so a fused op's result is
    # its `out=` alloc, and a use of the result keeps that alloc live.
    schema = getattr(node.target, "_schema", None)
    if isinstance(schema, torch._C.FunctionSchema):
        written = _written_outputs(node, schema)
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
