"""Proofs that an attention call over a KV cache is ExecuTorch's causal `custom_sdpa`.

The ATen-stage pass `exirc.backend.bind_kv_attention` binds an
`aten.scaled_dot_product_attention` to `llama::update_cache` and
`llama::custom_sdpa` only when this module proves, from the graph alone, that
the two compute the same values:

    keys      k = cache.index_copy_(2, positions, k_new) (a buffer [B, Hkv, S_max, D]),
              read whole, or through the grouped-query repeat
              reshape(expand(unsqueeze(k, 2), [B, Hkv, r, S_max, D]), [B, Hkv*r, S_max, D])
    positions arange(S) + s, for a 0-d int64 s (the same s for both caches and the mask)
    mask      arange(S_max)[..., None, :] <= (arange(S) + s)[..., :, None] (bool, `le` or
              `ge`, through unsqueezes and a broadcasting expand), so row i sees
              positions 0 .. s + i: the causal mask of start position s
    call      no dropout, no causal flag, no `enable_gqa`, float32

The query's length S may be dynamic (a method exported with a `Dim`): every
proof then holds for each S the method accepts, as each compares sizes as
symbolic expressions (one symbol is one value at run time; expressions that
are equal but written differently are a near miss, never assumed equal), and
S is proven at least 1 (the start position is the first position written).
Every other size (batch, heads, head size, the cache) must be static.

Two values of s are the same when they are the same scalar: a select of one
element of a user input, seen through int64 conversions and through a 0-d
buffer the method sets to it (transformers' `cumulative_length.copy_(...)`).
Anything else is a near miss, left decomposed with the reason why.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import sympy
import torch
from torch.fx import Node
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

aten = torch.ops.aten
_SDPA = aten.scaled_dot_product_attention.default
_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
               "enable_gqa")
_DEFAULTS: dict[str, Any] = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False,
                             "scale": None, "enable_gqa": False}
_INT_SAME = (aten.to.dtype_layout, aten.to.dtype, aten._to_copy.default, aten.alias.default,
             aten.clone.default)
_ARANGE = (aten.arange.default, aten.arange.start, aten.arange.start_step)


class NoMatch(Exception):
    """Why an attention call is not bound (its message is the report's reason)."""


@dataclass(frozen=True)
class CacheRead:
    """One cache the attention reads: the write, its buffer and its new rows."""

    write: Node                 # cache.index_copy_(2, positions, new)
    buffer: Node                # the buffer's placeholder
    new: Node                   # the rows written, [B, Hkv, S, D]
    positions: Node             # arange(S) + s, the positions written (s is its first)
    chain: tuple[Node, ...]     # the grouped-query repeat nodes (none if read whole)


@dataclass(frozen=True)
class Binding:
    """An attention call proven to be `custom_sdpa` over two caches."""

    call: Node
    query: Node
    key: CacheRead
    value: CacheRead
    scale: float


def fake(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, Node) else None


Size: TypeAlias = "int | sympy.Expr"  # a static size, or a dynamic one's symbolic expression


def _size(value: Any) -> Size | None:
    """An int or SymInt as a `Size` (a SymInt whose value is known is an int)."""
    if isinstance(value, torch.SymInt):
        expression = value.node.expr
        return int(expression) if expression.is_Integer else expression
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _at_least_one(size: Any, ranges: Mapping[Any, ValueRanges]) -> bool:
    """Whether an int or SymInt is 1 or more for every size the method accepts.
    `ranges` are the program's range constraints (its `Dim`s): not the symbols'
    ranges in the ShapeEnv, which assume every dynamic size is at least 2 (torch
    traced with that assumption; the method still accepts 1, and 0 if min=0)."""
    if isinstance(size, torch.SymInt):
        expression = size.node.expr
        if not expression.free_symbols <= set(ranges):
            return False
        known = {symbol: ranges[symbol] for symbol in expression.free_symbols}
        return bool(bound_sympy(expression, known).lower >= 1)
    return isinstance(size, int) and size >= 1


def _shape(node: Any) -> tuple[Size, ...]:
    value = fake(node)
    shape = [_size(s) for s in value.shape] if isinstance(value, torch.Tensor) else [None]
    if any(s is None for s in shape):
        raise NoMatch(f"%{getattr(node, 'name', node)} has no known shape")
    return tuple(shape)  # no None: checked above


def _is(node: Any, *targets: Any) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def _writes_into(node: Node, target: Node) -> bool:
    """Whether the call `node` writes into `target` (an in-place or out argument)."""
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or schema is None:
        return False
    for index, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        given = node.args[index] if index < len(node.args) and not argument.kwarg_only \
            else node.kwargs.get(argument.name)
        if given is target or (isinstance(given, (list, tuple)) and target in given):
            return True
    return False


def _is_int_scalar(node: Any) -> bool:
    value = fake(node)
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype == torch.int64


def _aliases_input(node: Node) -> bool:
    """Whether a call's result is its first argument's memory (a view, an in-place
    op, a `to` that converts nothing)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], Node):
        return False
    if node.target is operator.getitem:  # an element of a list of views (split, unbind)
        return _aliases_input(node.args[0])
    if node.target in (aten.to.dtype_layout, aten.to.dtype, aten.alias.default):
        return fake(node.args[0]) is not None and fake(node) is not None and \
            fake(node.args[0]).dtype == fake(node).dtype
    schema = getattr(node.target, "_schema", None)
    returns = list(schema.returns) if schema is not None else []
    return len(returns) == 1 and returns[0].alias_info is not None


def _group(node: Node) -> tuple[Node, list[Node]]:
    """The root of `node`'s memory and every node that is that memory (a select
    of an input counts as a root: `scalar_key` checks the input is never written)."""
    while _aliases_input(node) and not _is(node, aten.select.int):
        source = node.args[0]
        assert isinstance(source, Node)  # _aliases_input checked
        node = source
    group = [node]
    for member in group:
        group += [user for user in member.users if _aliases_input(user)
                  and user.args[0] is member and user not in group]
    return node, group


def _is_written(node: Node) -> bool:
    """Whether any op writes into `node` or into a view or alias of it."""
    group = [node]
    for member in group:
        group += [user for user in member.users if _aliases_input(user)
                  and user.args[0] is member and user not in group]
    return any(_writes_into(user, member) for member in group for user in member.users)


def scalar_key(node: Any, reader: Node, order: dict[Node, int]) -> Hashable:
    """A key equal for two 0-d int64 tensors that provably hold the same value
    when `reader` reads them: the value of the last write into their memory
    before `reader` (a `copy_` of a known scalar), or, unwritten, a select of
    one element of a user input no op writes."""
    if not _is_int_scalar(node):
        raise NoMatch(f"the start position %{getattr(node, 'name', node)} is not a 0-d int64")
    root, group = _group(node)
    writes = [user for member in group for user in member.users
              if _writes_into(user, member) and order[user] < order[reader]]
    if writes:
        last = max(writes, key=order.__getitem__)
        source = last.args[1] if len(last.args) > 1 else None
        if last.target is not aten.copy_.default or last.args[0] not in group or \
                not _is_int_scalar(source):
            raise NoMatch(f"the start position %{node.name} is changed by %{last.name} "
                          "before it is read")
        return scalar_key(source, last, order)
    if _is(root, *_INT_SAME) and _is_int_scalar(root.args[0]):
        return scalar_key(root.args[0], root, order)
    if _is(root, aten.select.int):
        source, dim, index = root.args
        if isinstance(source, Node) and source.op == "placeholder" and dim == 0 and \
                isinstance(index, int) and not _is_written(source):
            return ("select", source.name, index)
    raise NoMatch(f"cannot tell what the start position %{node.name} holds")


def _arange_length(node: Any) -> Size | None:
    if not _is(node, *_ARANGE) or set(node.kwargs) - {"device", "pin_memory", "layout",
                                                     "dtype"}:
        return None
    args = list(node.args)
    if node.target is aten.arange.default:
        args = [0, *args]
    if len(args) == 2:
        args.append(1)
    start, end, step = args
    end = _size(fake(end) if isinstance(end, Node) else end)
    if start != 0 or step != 1 or end is None or \
            node.kwargs.get("dtype", torch.int64) != torch.int64:
        return None
    return end


def positions(node: Any, order: dict[Node, int]) -> tuple[Hashable | int, Size]:
    """(offset, n) for a 1-D int64 node equal to arange(n) + offset: the offset
    is a Python int, or the key of a 0-d tensor (`scalar_key`)."""
    length = _arange_length(node)
    if length is not None:
        return 0, length
    if _is(node, aten.add.Tensor) and len(node.args) == 2 and not node.kwargs:
        for ramp, shift in (node.args, node.args[::-1]):
            length = _arange_length(ramp)
            if length is None:
                continue
            if isinstance(shift, int) and not isinstance(shift, bool):
                return shift, length
            if _is_int_scalar(shift):
                return scalar_key(shift, node, order), length
    raise NoMatch(f"%{getattr(node, 'name', node)} is not arange(n) + a start position")


def _unsqueezed(node: Any) -> Any:
    while _is(node, aten.unsqueeze.default):
        node = node.args[0]
    return node


def _lead_stripped(node: Any) -> tuple[Size, ...]:
    shape = _shape(node)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape


def check_mask(mask: Any, start: Hashable, length: Size, cache_length: int,
               order: dict[Node, int]) -> None:
    """That `mask` is the causal mask of start position `start` for `length` rows."""
    if mask is None:
        raise NoMatch("no mask: attention reads the whole cache, not a causal prefix")
    if _is(mask, aten.expand.default):
        source = mask.args[0]
        if _shape(source)[-2:] != _shape(mask)[-2:]:
            raise NoMatch("the mask is broadcast along its rows or positions")
        mask = source
    shape = _shape(mask)
    if fake(mask).dtype != torch.bool or len(shape) < 2 or \
            shape[-2:] != (length, cache_length) or not all(s == 1 for s in shape[:-2]):
        raise NoMatch(f"the mask is not a bool [{length}, {cache_length}] (or that with "
                      "leading 1s)")
    if _is(mask, aten.le.Tensor):
        columns, rows = mask.args
    elif _is(mask, aten.ge.Tensor):
        rows, columns = mask.args
    else:
        raise NoMatch(f"the mask is {getattr(mask, 'target', mask)}, not a position "
                      "comparison")
    if _lead_stripped(columns) != (cache_length,) or \
            _lead_stripped(rows) not in ((length, 1), () if length == 1 else None):
        raise NoMatch("the mask does not compare cache positions with query positions")
    if positions(_unsqueezed(columns), order) != (0, cache_length):
        raise NoMatch("the mask's columns are not the cache positions 0 .. S_max - 1")
    if positions(_unsqueezed(rows), order) != (start, length):
        raise NoMatch("the mask's rows are not the positions the cache is written at")


def cache_read(node: Any, call: Node, heads: int,
               order: dict[Node, int]) -> tuple[CacheRead, int]:
    """The cache an attention input reads, and the grouped-query repeat factor."""
    if not isinstance(node, Node) or set(node.users) != {call}:
        raise NoMatch("the key or value is read outside the attention")
    chain: list[Node] = []
    repeat = 1
    if _is(node, aten.reshape.default, aten.view.default):
        expand: Any = node.args[0]
        unsqueeze: Any = expand.args[0] if _is(expand, aten.expand.default) else None
        if not _is(unsqueeze, aten.unsqueeze.default) or unsqueeze.args[1] != 2:
            raise NoMatch("the key or value is reshaped, but not by the grouped-query repeat")
        expanded, source = _shape(expand), _shape(unsqueeze.args[0])
        repeat = expanded[2]
        if len(source) != 4 or expanded != (source[0], source[1], repeat, *source[2:]) or \
                _shape(node) != (source[0], source[1] * repeat, *source[2:]):
            raise NoMatch("the key or value repeat is not the grouped-query one")
        chain = [node, expand, unsqueeze]
        node = unsqueeze.args[0]
    if not _is(node, aten.index_copy_.default):
        raise NoMatch("the key or value is not a cache written with index_copy_ along dim 2")
    buffer, dim, index, new = node.args
    if dim != 2 or not isinstance(buffer, Node) or buffer.op != "placeholder":
        raise NoMatch("the cache written is not a buffer written along its positions (dim 2)")
    cache, rows = _shape(buffer), _shape(new)
    if len(cache) != 4 or fake(buffer).dtype != torch.float32 or \
            fake(new).dtype != torch.float32 or rows[:2] + rows[3:] != cache[:2] + cache[3:] \
            or cache[1] * repeat != heads:
        raise NoMatch("the cache is not a float32 [B, Hkv, S_max, D] the rows fit")
    offset, length = positions(index, order)
    if isinstance(offset, int) or length != rows[2] or _is_written(index):
        raise NoMatch("the cache is written at positions other than arange(S) + start")
    if set(buffer.users) != {node}:
        raise NoMatch(f"the cache {buffer.name} is read or written elsewhere")
    for earlier, later in zip([*chain[1:], node], chain):
        if set(earlier.users) != {later}:
            raise NoMatch(f"the cache {buffer.name} or its repeat is read elsewhere")
    return CacheRead(node, buffer, new, index, tuple(chain)), repeat


def match(node: Node, order: dict[Node, int], ranges: Mapping[Any, ValueRanges]) -> Binding:
    """The binding of one attention call; NoMatch saying why there is none.
    `order` numbers the graph's nodes (a value depends on the writes before it);
    `ranges` are the program's range constraints."""
    if len(node.args) > len(_PARAMETERS) or set(node.kwargs) - set(_PARAMETERS):
        raise NoMatch("unexpected arguments")
    given = {**_DEFAULTS, **dict(zip(_PARAMETERS, node.args)), **node.kwargs}
    if given["dropout_p"] != 0.0 or given["enable_gqa"] is not False or \
            given["is_causal"] is not False:
        raise NoMatch("dropout, enable_gqa or is_causal (the causal flag is top-left "
                      "aligned, not at the cache position)")
    query = given["query"]
    batch, heads, length, size = _shape(query)
    if fake(query).dtype != torch.float32:
        raise NoMatch("the query is not float32")
    if not all(isinstance(s, int) for s in (batch, heads, size)):
        raise NoMatch("the query's batch, heads or head size is dynamic")
    if not _at_least_one(fake(query).shape[2], ranges):
        raise NoMatch("the query's length may be 0 (a Dim with min=0): no start position")
    key, repeat = cache_read(given["key"], node, heads, order)
    value, value_repeat = cache_read(given["value"], node, heads, order)
    if key.buffer is value.buffer or repeat != value_repeat or \
            _shape(key.buffer) != _shape(value.buffer):
        raise NoMatch("the key and value caches differ in shape or are one buffer")
    cache = _shape(key.buffer)
    if cache[0] != batch or cache[3] != size or _shape(key.new)[2] != length:
        raise NoMatch("the query's batch, length or head size is not the cache's")
    start = positions(key.positions, order)[0]
    if positions(value.positions, order)[0] != start:
        raise NoMatch("the key and value caches are written at different positions")
    check_mask(given["attn_mask"], start, length, cache[2], order)
    scale = given["scale"]
    scale = size ** -0.5 if scale is None else scale
    if not isinstance(scale, (int, float)):
        raise NoMatch("the scale is not a number")
    return Binding(node, query, key, value, float(scale))


def is_attention(node: Node) -> bool:
    return node.op == "call_function" and node.target is _SDPA
