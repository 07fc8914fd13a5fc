"""TorchScript's prim::If and prim::Loop as torch.cond and while_loop.

  * `prim::If` on a Python bool runs one block; on a tensor (from
    `aten::Bool(tensor)`) it becomes `torch.cond`. Of an `assert` on
    tensor data (a branch that raises) only the other branch is kept.
  * `prim::Loop(max_trip_count, condition, carried...)` runs
    `block(i, carried...) -> (next_condition, next_carried...)` while
    `i < max_trip_count` and the condition holds. While both are Python
    values the iterations run in Python, so constant-trip loops unroll as
    TS2EPConverter unrolls them. Once either is a tensor the rest of the
    loop is one while_loop, carrying the counter, the condition and the
    carried values, all as tensors (numbers lifted, see `torchscript_ops`).

The ops are called directly (`cond_op`, `while_loop_op`), with every tensor
a body reads passed in as an operand: the public `torch.cond` and
`while_loop` would have torch.compile trace the bodies, and it cannot trace
the interpreter that runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.utils._pytree as pytree
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.while_loop import while_loop_op

from exirc.capture.torchscript_ops import SYMBOLIC, is_static, lifted_dtype, scalar_tensor

if TYPE_CHECKING:
    from exirc.capture.torchscript_interpreter import Run


class Scope(Protocol):
    """A torch._C.Graph or torch._C.Block: what `Run.scope` walks."""

    def inputs(self) -> Iterator[torch._C.Value]: ...
    def nodes(self) -> Iterator[torch._C.Node]: ...
    def outputs(self) -> Iterator[torch._C.Value]: ...


# --------------------------------------------------------------------------- which path


def has_loop(graph: torch._C.Graph) -> bool:
    return any(node.kind() == "prim::Loop" for node in all_nodes(graph))


def has_computed_loop(graph: torch._C.Graph) -> bool:
    """Whether a loop's trip count or condition is computed, which TS2EPConverter refuses.

    Its unrolling needs the trip count to be a constant and the condition
    never to change; an attribute (`range(self.n)`) counts as a constant
    too, as its freezing makes it one.
    """
    for node in all_nodes(graph):
        if node.kind() != "prim::Loop":
            continue
        trip_count = next(node.inputs()).node().kind()
        condition = next(_body(node).outputs()).node()
        if trip_count not in ("prim::Constant", "prim::GetAttr") or _inside(condition, node):
            return True
    return False


def _inside(node: torch._C.Node, ancestor: torch._C.Node) -> bool:
    block = node.owningBlock()
    while block is not None:
        owner = block.owningNode()
        if owner is None:
            return False
        if owner == ancestor:
            return True
        block = owner.owningBlock()
    return False


def _body(loop: torch._C.Node) -> torch._C.Block:
    return list(loop.blocks())[0]  # (an iterator at run time, a list in torch's stubs)


def all_nodes(scope: Scope) -> Iterator[torch._C.Node]:
    """Every node of a graph or block, and of the blocks inside them."""
    for node in scope.nodes():
        yield node
        for block in node.blocks():
            yield from all_nodes(block)


# --------------------------------------------------------------------------- traced bodies


class Capture:
    """What a cond branch or while_loop body reads from outside it, as operands.

    torch.cond and while_loop trace a body apart from the program around it:
    every tensor it reads must come in as an operand (only torch.compile
    would find closures, and it cannot trace this interpreter). Those are
    the values the blocks use but do not define, and the module attributes
    they read, flattened to tensors; anything else (numbers, modules) is
    known while tracing and stays as it is.
    """

    def __init__(self, run: Run, blocks: Sequence[torch._C.Block]) -> None:
        values: dict[int, Any] = {}
        for block in blocks:
            for value in _free_values(block):
                values[value.unique()] = run.get(value)
            for node in all_nodes(block):  # attribute reads, so parameters become operands
                if node.kind() == "prim::GetAttr" and node.input().unique() in values:
                    attribute = run.module_attribute(node, values[node.input().unique()])
                    if attribute is not None:
                        values[node.output().unique()] = attribute
        self.ids = list(values)
        leaves, self.spec = pytree.tree_flatten(list(values.values()))
        # A symbolic size (dynamic shapes) goes in as a lifted number: a
        # closure over it would specialize it.
        self.leaves = [scalar_tensor(leaf, None) if isinstance(leaf, SYMBOLIC) else leaf
                       for leaf in leaves]
        self.positions = [i for i, leaf in enumerate(self.leaves)
                          if isinstance(leaf, torch.Tensor)]
        self.operands = tuple(self.leaves[i] for i in self.positions)

    def bind(self, run: Run, operands: Sequence[torch.Tensor]) -> Run:
        """A child run that sees `operands` where the body's outer tensors were."""
        leaves = list(self.leaves)
        for position, operand in zip(self.positions, operands):
            leaves[position] = operand
        return run.child(dict(zip(self.ids, pytree.tree_unflatten(leaves, self.spec))))


def _free_values(block: torch._C.Block) -> list[torch._C.Value]:
    """The values `block` (and the blocks inside it) uses but does not define."""
    defined: set[int] = set()
    free: dict[int, torch._C.Value] = {}

    def visit(scope: Scope) -> None:
        defined.update(value.unique() for value in scope.inputs())
        for node in scope.nodes():
            for value in node.inputs():
                if value.unique() not in defined:
                    free.setdefault(value.unique(), value)
            for inner in node.blocks():
                visit(inner)
            defined.update(value.unique() for value in node.outputs())
        for value in scope.outputs():
            if value.unique() not in defined:
                free.setdefault(value.unique(), value)

    visit(block)
    return list(free.values())


def _unaliased(results: list[torch.Tensor], given: Sequence[torch.Tensor]
               ) -> tuple[torch.Tensor, ...]:
    """The results, copied where one aliases what the body was given or another result.

    Higher-order ops refuse a body that returns (a view of) an operand, and
    TorchScript blocks often pass a value through unchanged.
    """
    is_alias_of = torch._C._is_alias_of  # type: ignore[attr-defined]
    unaliased: list[torch.Tensor] = []
    for result in results:
        if any(is_alias_of(result, other) for other in [*given, *unaliased]):
            result = result.clone()
        unaliased.append(result)
    return tuple(unaliased)


def _as_tensor(run: Run, node: torch._C.Node, result: Any, value: torch._C.Value
               ) -> torch.Tensor:
    """A value crossing a cond or while_loop boundary, which carries only tensors."""
    is_number, dtype = lifted_dtype(value)
    if is_number:
        return scalar_tensor(result, dtype)
    if isinstance(result, torch.Tensor):
        return result
    raise run.unsupported(node, f"gives {value.debugName()!r}, a {value.type()}, from a branch "
                                "or loop that depends on tensor data; only tensors and numbers "
                                "can cross one")


# --------------------------------------------------------------------------- prim::If


def run_if(run: Run, node: torch._C.Node) -> list[Any]:
    predicate = run.get(node.input())
    then_block, else_block = node.blocks()
    if is_static(predicate):
        return run.scope(then_block if predicate else else_block, [])
    predicate = scalar_tensor(predicate, torch.bool)
    raising = [_raises(then_block), _raises(else_block)]
    if all(raising):
        raise run.error(node, "both branches of an if raise", hint="the module always fails here")
    if any(raising):
        # An assert on tensor data: the program goes on with the other branch.
        # Not checked at run time, like every assertion exirc compiles (the
        # edge stage's remove_assertions drops torch's own).
        return run.scope(else_block if raising[0] else then_block, [])
    outputs = list(node.outputs())
    capture = Capture(run, [then_block, else_block])

    def branch(block: torch._C.Block) -> Callable[..., tuple[torch.Tensor, ...]]:
        def results(*operands: torch.Tensor) -> tuple[torch.Tensor, ...]:
            values = capture.bind(run, operands).scope(block, [])
            return _unaliased([_as_tensor(run, node, v, out) for v, out in zip(values, outputs)],
                              operands)
        return results

    return list(cond_op(predicate, branch(then_block), branch(else_block), capture.operands))


def _raises(block: torch._C.Block) -> bool:
    return any(node.kind() == "prim::RaiseException" for node in block.nodes())


# --------------------------------------------------------------------------- prim::Loop


def run_loop(run: Run, node: torch._C.Node) -> list[Any]:
    trip_count, condition, *carried = run.inputs(node)
    body = _body(node)
    iteration = 0
    # Unroll while everything deciding the next iteration is known now.
    while is_static(condition) and is_static(trip_count):
        if not condition or iteration >= trip_count:
            return carried
        condition, *carried = run.scope(body, [iteration, *carried])
        iteration += 1
    return _while_loop(run, node, iteration, trip_count, condition, carried)


def _while_loop(run: Run, node: torch._C.Node, iteration: int, trip_count: Any,
                condition: Any, carried: list[Any]) -> list[Any]:
    """The rest of the loop as one while_loop.

    It carries (i, condition, carried...); its extra operands are the trip
    count, when only known at run time, then what the body reads.
    """
    body = _body(node)
    outputs = list(node.outputs())
    state = (scalar_tensor(iteration, torch.int64), scalar_tensor(condition, torch.bool),
             *(_as_tensor(run, node, v, out) for v, out in zip(carried, outputs)))
    capture = Capture(run, [body])
    bound = is_static(trip_count)
    limit = () if bound else (scalar_tensor(trip_count, torch.int64),)
    extra = len(state) + len(limit)  # where the captured operands start

    def keep_going(*operands: torch.Tensor) -> torch.Tensor:
        i, go = operands[:2]
        # (against INT64_MAX too, a `while` loop's: a fresh tensor, where go would alias)
        return torch.logical_and(go, i < (trip_count if bound else operands[len(state)]))

    def step(*operands: torch.Tensor) -> tuple[torch.Tensor, ...]:
        i, _, *values = operands[:len(state)]
        go, *values = capture.bind(run, operands[extra:]).scope(body, [i, *values])
        return _unaliased([i + 1, scalar_tensor(go, torch.bool),
                           *(_as_tensor(run, node, v, out) for v, out in zip(values, outputs))],
                          operands)

    results = while_loop_op(keep_going, step, state,  # type: ignore[arg-type]
                            (*limit, *capture.operands))
    return list(results[2:])
