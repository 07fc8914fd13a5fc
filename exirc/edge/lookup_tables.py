"""Lookup tables: what a model computes from positions it can only have a few of.

transformers' LLaMA computes RoPE's cos and sin from the positions on every
call (`positions * inv_freq`, a cat, cos, sin, a scaling): a dozen operators
whose only input that changes is an integer tensor. When the program itself
bounds that integer to [0, L) -- the positions are where it writes a KV cache
of L slots, a write that fails for any other -- each such value is one of L
rows, computed here once for every position and gathered at run time
(`embedding(table, positions)`: one call instead of the chain).

The rows are computed as eager PyTorch computes the chain, on a batch of all L
positions, in the chain's own dtype: the gathered values are the ones the
chain would have given. Where every reader multiplies a table's values by
RoPE's `rotate_half` (`cat([-b, a])`), b's negation moves into the table's rows
(exact: a product's sign is its factors'), one node fewer per rotation.
Nothing changes where the bound is not proven, or where a table would exceed
`max_bytes`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.fx import Node

from exirc.edge.constants import add_constant, constant_tensor
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

aten = torch.ops.aten
# Per position, elementwise: the position axis stays where it is.
_UNARY = frozenset({aten.cos.default, aten.sin.default, aten.neg.default, aten.exp.default,
                    aten.sqrt.default, aten.rsqrt.default, aten.reciprocal.default,
                    aten.sigmoid.default, aten.tanh.default, aten.abs.default,
                    aten.log.default, aten.clone.default, aten._to_copy.default,
                    aten.pow.Tensor_Scalar})
_BINARY = frozenset({aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor})
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_CACHE_WRITE = "exirc.llama_update_cache.default"  # bind_kv_attention's cache write


@dataclass(frozen=True)
class LookupTables(Pass):
    """Edge -> Edge: a value computed only from bounded positions and constants,
    by per-position elementwise ops, becomes `embedding(table, positions)`.

    Positions are bounded when they are `arange(n) + start` and a KV-cache
    write (`llama_update_cache`) of those n rows starts at their first:
    the write fails unless 0 <= start and start + n <= the cache's length L,
    so every position is in [0, L). A value is tabulated when its shape is
    the positions' (or an unsqueeze of them) plus one trailing dim, its dtype
    is a float, and its table (L rows) is at most `max_bytes`, as is every value
    it is computed from (each is computed for all L positions at once).
    """

    name: ClassVar[str] = "lookup_tables"
    max_bytes: int = 1 << 20

    def run(self, program: ExportedProgram) -> PassResult:
        graph = program.graph_module.graph
        changed = False
        for positions, length in dict(_bounded_positions(graph)).items():
            changed |= _tabulate(program, positions, length, self.max_bytes)
        if changed:
            program.graph_module.recompile()
        return PassResult(program, changed)


# --------------------------------------------------------------------------
# Which positions are bounded, and by what.
# --------------------------------------------------------------------------


def _bounded_positions(graph: torch.fx.Graph) -> Iterator[tuple[Node, int]]:
    """(positions, L) for every cache write of the method (not in control flow:
    a write there may not run) that bounds its positions to [0, L)."""
    for node in graph.nodes:
        if node.op == "call_function" and str(node.target) == _CACHE_WRITE:
            found = _written_positions(node)
            if found is not None:
                yield found


def _written_positions(write: Node) -> tuple[Node, int] | None:
    value, cache, start = write.args[:3]
    item = start if isinstance(start, Node) else None
    if item is None or item.target is not aten._local_scalar_dense.default:
        return None
    first = item.args[0]
    if not isinstance(first, Node) or first.target is not aten.select_copy.int \
            or list(first.args[1:]) != [0, 0]:
        return None
    positions = first.args[0]
    if not isinstance(positions, Node) or not _is_arange_plus_start(positions):
        return None
    rows, slots = _val(value), _val(cache)
    count = _val(positions)
    if rows is None or slots is None or count is None or rows.dim() != 4 or \
            slots.dim() != 4 or not isinstance(slots.shape[1], int) or \
            not _same_size(rows.shape[1], count.shape[0]):
        return None
    return positions, int(slots.shape[1])


def _is_arange_plus_start(node: Node) -> bool:
    """`arange(0, n) + start` (start a 0-d integer): n positions from start on."""
    if node.target is not aten.add.Tensor or node.kwargs.get("alpha", 1) != 1:
        return False
    value = _val(node)
    if value is None or value.dim() != 1 or value.dtype.is_floating_point:
        return False
    for steps, start in (node.args[:2], node.args[1::-1]):
        begin = _val(start) if isinstance(start, Node) else None
        if isinstance(steps, Node) and _is_arange_from_zero(steps) and begin is not None \
                and begin.dim() == 0 and not begin.dtype.is_floating_point:
            return True
    return False


def _is_arange_from_zero(node: Node) -> bool:
    if node.target is aten.arange.default:
        return True
    args: tuple[Any, ...] = node.args
    return node.target is aten.arange.start_step and args[0] == 0 and \
        (len(args) < 3 or args[2] == 1)


# --------------------------------------------------------------------------
# What is computed from them, and its tables.
# --------------------------------------------------------------------------


def _tabulate(program: ExportedProgram, positions: Node, length: int, max_bytes: int) -> bool:
    axes = _per_position(program, positions, length, max_bytes)
    region = [n for n in axes if n is not positions]
    order = {n: i for i, n in enumerate(positions.graph.nodes)}
    indices = {n for n in axes if _is_index_of(n, positions)}
    rows: dict[Node, torch.Tensor] = {}
    done: set[Node] = set()
    for exit_node in [n for n in region if any(u not in axes for u in n.users)]:
        found = _tabulable(exit_node, axes, indices, order)
        if found is None or found[0] in done:
            continue
        value, index = found
        rows = rows or _evaluate(program, positions, length, region)
        table = rows[value].reshape(length, rows[value].shape[-1]).contiguous()
        if table.nbytes > max_bytes:
            continue
        rotations = _rotations(value, table.shape[1])
        if rotations is not None:
            table = _fold_signs(table, *rotations)
        constant = add_constant(program, f"_table_{value.name}", table,
                                described=f"table of {value.name} by {positions.name}")
        with positions.graph.inserting_before(value):
            gathered = positions.graph.call_function(aten.embedding.default, (constant, index))
        gathered.meta.update({k: v for k, v in value.meta.items()
                              if k in ("val", "stack_trace", "nn_module_stack")})
        value.replace_all_uses_with(gathered)
        done.add(value)
    for node in reversed(region if done else []):
        if not node.users:
            positions.graph.erase_node(node)
    return bool(done)


def _rotations(value: Node, columns: int) -> tuple[list[Node], int] | None:
    """The `cat([-b, a], -1)` (RoPE's rotate_half) that every reader of `value`
    multiplies it by, through unsqueezes, and the width of b: None unless every
    reader does so, each cat and negation read by that product alone."""
    chain, cats, widths = {value}, [], set()
    pending = list(value.users)
    while pending:
        user = pending.pop()
        if user.target is aten.unsqueeze_copy.default and _shape(user)[-1:] == [columns]:
            chain.add(user)
            pending.extend(user.users)
            continue
        if user.target is not aten.mul.Tensor or user.kwargs:
            return None
        operands = list(user.args[:2])
        cat = operands[0] if operands[1] in chain else operands[1]
        if not isinstance(cat, Node) or cat in chain or cat.target is not aten.cat.default \
                or len(cat.users) != 1 or _shape(cat)[-1:] != [columns]:
            return None
        parts = cat.args[0]
        dim = cat.args[1] if len(cat.args) > 1 else 0
        if not isinstance(parts, (list, tuple)) or len(parts) != 2 or \
                dim not in (-1, len(_shape(cat)) - 1):
            return None
        negated = parts[0]
        if not isinstance(negated, Node) or negated.target is not aten.neg.default or \
                len(negated.users) != 1 or not isinstance(_shape(negated)[-1], int):
            return None
        cats.append(cat)
        widths.add(int(_shape(negated)[-1]))
    return (cats, widths.pop()) if cats and len(widths) == 1 else None


def _fold_signs(table: torch.Tensor, cats: list[Node], width: int) -> torch.Tensor:
    """`cat([-b, a]) * row` is `cat([b, a]) * row'` with row' = row's first `width`
    values negated, exactly (a product's sign is its factors' signs): the
    negations go, into the table."""
    for cat in cats:
        parts: Any = cat.args[0]
        negated, kept = parts
        cat.args = ([negated.args[0], kept], *cat.args[1:])
        negated.graph.erase_node(negated)
    folded = table.clone()
    folded[:, :width] = -folded[:, :width]
    return folded


def _per_position(program: ExportedProgram, positions: Node, length: int, max_bytes: int
                  ) -> dict[Node, int]:
    """The nodes computed from `positions` and constants by ops that keep each
    position apart, each with its position axis (counted from the right); each
    at most `max_bytes` for all `length` positions, as it is computed so."""
    axes = {positions: -1}
    for node in positions.graph.nodes:
        if node.op != "call_function" or node in axes:
            continue
        operands = [a for a in _flat([*node.args, *node.kwargs.values()])
                    if isinstance(a, Node)]
        if not any(a in axes for a in operands):
            continue
        if any(a not in axes and constant_tensor(program, a) is None for a in operands):
            continue
        axis = _axis(node, axes)
        value = _val(node)
        if axis is None or value is None or -axis > value.dim() or \
                not _same_size(value.shape[axis], _shape(positions)[0]):
            continue
        others = [d for i, d in enumerate(value.shape) if i != value.dim() + axis]
        if not all(isinstance(d, int) for d in others) or \
                length * value.element_size() * math.prod(others) > max_bytes:
            continue
        axes[node] = axis
    return axes


def _axis(node: Node, axes: dict[Node, int]) -> int | None:
    """The position axis of `node`'s result, or None if an op may mix positions."""
    target = node.target
    args: tuple[Any, ...] = node.args
    if target in _UNARY:
        if target is aten._to_copy.default and set(node.kwargs) - {"dtype"}:
            return None
        return axes.get(args[0]) if isinstance(args[0], Node) else None
    if target in _BINARY:
        if set(node.kwargs) - {"alpha"} or node.kwargs.get("alpha", 1) != 1:
            return None
        inside = {axes[a] for a in args[:2] if isinstance(a, Node) and a in axes}
        if len(inside) != 1:
            return None
        axis = inside.pop()
        for other in args[:2]:
            if isinstance(other, Node) and other not in axes:
                shape = _shape(other)  # a constant: one value along the positions
                if len(shape) >= -axis and shape[axis] != 1:
                    return None
        return axis
    if target is aten.unsqueeze_copy.default and isinstance(args[0], Node):
        rank = len(_shape(args[0]))
        at_left = rank + axes[args[0]]
        dim = int(args[1]) % (rank + 1)
        return at_left + (dim <= at_left) - (rank + 1)
    if target is aten.cat.default:
        parts = args[0]
        if not isinstance(parts, (list, tuple)) or \
                not all(isinstance(p, Node) and p in axes for p in parts):
            return None
        found = {axes[p] for p in parts}
        rank = len(_shape(parts[0]))
        dim = int(args[1]) if len(args) > 1 else 0
        if len(found) != 1 or (dim % rank) - rank == next(iter(found)):
            return None
        return found.pop()
    return None


def _is_index_of(node: Node, positions: Node) -> bool:
    """The positions themselves, or an unsqueeze of them (the same integers)."""
    while node is not positions:
        if node.target is not aten.unsqueeze_copy.default or not isinstance(node.args[0], Node):
            return False
        node = node.args[0]
    return True


def _tabulable(node: Node, axes: dict[Node, int], indices: set[Node], order: dict[Node, int]
               ) -> tuple[Node, Node] | None:
    """The value to tabulate for an exit of the region (it, or what it unsqueezes),
    and the positions to gather it by (made before it): the value's shape is
    theirs plus one dim."""
    while True:
        value = _val(node)
        if value is not None and value.dtype in _FLOATS and value.dim() >= 2 and \
                isinstance(value.shape[-1], int):
            for index in sorted(indices, key=order.__getitem__):
                if order[index] < order[node] and \
                        _same_shape(_shape(index), list(value.shape[:-1])):
                    return node, index
        source = node.args[0] if node.args else None
        if node.target is not aten.unsqueeze_copy.default or source not in axes or \
                not isinstance(source, Node) or source in indices:
            return None
        node = source


def _evaluate(program: ExportedProgram, positions: Node, length: int,
              region: list[Node]) -> dict[Node, torch.Tensor]:
    """Every region value for all `length` positions at once, as eager computes it."""
    value = _val(positions)
    assert value is not None
    values: dict[Node, Any] = {positions: torch.arange(length, dtype=value.dtype)}

    def read(arg: Any) -> Any:
        if isinstance(arg, Node):
            if arg in values:
                return values[arg]
            return constant_tensor(program, arg)
        if isinstance(arg, (list, tuple)):
            return type(arg)(read(a) for a in arg)
        return arg

    with torch.no_grad():
        for node in region:
            assert callable(node.target)
            values[node] = node.target(*read(node.args), **read(node.kwargs))
    return values


def _flat(args: Any) -> Iterator[Any]:
    for arg in args:
        if isinstance(arg, (list, tuple)):
            yield from _flat(arg)
        else:
            yield arg


def _val(node: Any) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _shape(node: Node) -> list[Any]:
    value = _val(node)
    return list(value.shape) if value is not None else []


def _same_size(a: Any, b: Any) -> bool:
    """Whether two sizes are equal for every input: equal numbers, or one symbol."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return bool(a.node.expr == b.node.expr)
    return False


def _same_shape(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(_same_size(x, y) for x, y in zip(a, b))
