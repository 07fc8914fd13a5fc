"""Mutations of a method's values: scalars, lists, and tensors' types and shapes.

Each registers itself under its kind name (`context.model_kind`) and returns
what it changed, naming the method and value (`forward %12`), so a failure
report says which field of which program was bent.
"""

from __future__ import annotations

import math
from typing import Any

from exirc.serialize import program as P
from tools.mutants import picks
from tools.mutants.context import Context, model_kind

_LIST_KINDS = (P.IntList, P.TensorList, P.OptionalTensorList, P.DoubleList, P.BoolList)
_EDGE_DOUBLES = [math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -0.0, 2.0**63, 1e10]
_RAW_SCALAR_TYPES = [8, 9, 10, 18, 19, 20, 21, 30, 100, 127, -1, -128]


@model_kind("int_value")
def int_value(ctx: Context) -> str | None:
    """An Int (a dim, a size, an index, a flag) becomes an edge value."""
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.value_indices(plan, P.Int)) if plan else None
    if plan is None or index is None:
        return None
    value = plan.values[index]
    assert isinstance(value, P.Int)
    old = value.int_val
    value.int_val = ctx.rng.choice(picks.EDGE_INTS + [old + 1, old - 1, -old])
    return f"{plan.name} %{index} Int {old} -> {value.int_val}"


@model_kind("double_value")
def double_value(ctx: Context) -> str | None:
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.value_indices(plan, P.Double)) if plan else None
    if plan is None or index is None:
        return None
    value = plan.values[index]
    assert isinstance(value, P.Double)
    old = value.double_val
    value.double_val = ctx.rng.choice(_EDGE_DOUBLES)
    return f"{plan.name} %{index} Double {old} -> {value.double_val}"


@model_kind("list_length")
def list_length(ctx: Context) -> str | None:
    """A list (fixed-length in the schema, like a conv's stride) grows or shrinks."""
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.value_indices(plan, *_LIST_KINDS)) if plan else None
    if plan is None or index is None:
        return None
    value = plan.values[index]
    assert isinstance(value, _LIST_KINDS)
    items: list[Any] = value.items
    old = len(items)
    action = ctx.rng.choice(["drop", "drop_all", "repeat", "repeat_many"])
    if action == "drop" and items:
        del items[ctx.rng.randrange(len(items))]
    elif action == "drop_all":
        items.clear()
    elif items:
        extra = 1 if action == "repeat" else ctx.rng.choice([5, 64, 1000])
        items.extend(items[ctx.rng.randrange(len(items))] for _ in range(extra))
    else:
        return None
    return f"{plan.name} %{index} {type(value).__name__} length {old} -> {len(items)}"


@model_kind("list_item")
def list_item(ctx: Context) -> str | None:
    """An item of a list of value indices points at another value (of any kind)."""
    plan = picks.plan(ctx.program, ctx.rng)
    kinds = (P.IntList, P.TensorList, P.OptionalTensorList)
    index = picks.choice(ctx.rng, picks.value_indices(plan, *kinds)) if plan else None
    if plan is None or index is None:
        return None
    value = plan.values[index]
    assert isinstance(value, kinds)
    if not value.items:
        return None
    position = ctx.rng.randrange(len(value.items))
    old = value.items[position]
    value.items[position] = picks.any_value(plan, ctx.rng)
    return f"{plan.name} %{index} item {position}: %{old} -> %{value.items[position]}"


@model_kind("value_kind")
def value_kind(ctx: Context) -> str | None:
    """A value becomes another kind (a tensor an Int, an int list a tensor list, ...)."""
    plan = picks.plan(ctx.program, ctx.rng)
    if plan is None or not plan.values:
        return None
    index = ctx.rng.randrange(len(plan.values))
    old = plan.values[index]
    tensors = picks.tensors(plan)
    replacements: list[P.EValue] = [
        P.Null(), P.Int(ctx.rng.choice(picks.EDGE_INTS)), P.Bool(ctx.rng.random() < 0.5),
        P.Double(ctx.rng.choice(_EDGE_DOUBLES)), P.String("x" * ctx.rng.choice([0, 1, 300])),
        P.IntList([picks.any_value(plan, ctx.rng) for _ in range(ctx.rng.randrange(4))]),
        P.DoubleList([1.0, math.nan]), P.BoolList([True]),
        P.TensorList(list(ctx.rng.sample(tensors, min(len(tensors), 2)))),
        P.OptionalTensorList([-1] + tensors[:1]),
    ]
    if tensors:
        source = plan.values[ctx.rng.choice(tensors)]
        assert isinstance(source, P.Tensor)
        replacements.append(P.Tensor(source.scalar_type, list(source.sizes),
                                     list(source.dim_order), data_buffer_idx=0,
                                     allocation_info=source.allocation_info))
    new = ctx.rng.choice([r for r in replacements if type(r) is not type(old)])
    plan.values[index] = new
    return f"{plan.name} %{index} {type(old).__name__} -> {type(new).__name__}"


@model_kind("dtype")
def dtype(ctx: Context) -> str | None:
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.tensors(plan)) if plan else None
    if plan is None or index is None:
        return None
    tensor = plan.values[index]
    assert isinstance(tensor, P.Tensor)
    old = tensor.scalar_type
    if ctx.rng.random() < 0.85:
        tensor.scalar_type = ctx.rng.choice(list(P.ScalarType))
    else:  # a number no ScalarType has
        tensor.scalar_type = ctx.rng.choice(_RAW_SCALAR_TYPES)  # type: ignore[assignment]
    return f"{plan.name} %{index} scalar_type {int(old)} -> {int(tensor.scalar_type)}"


@model_kind("sizes")
def sizes(ctx: Context) -> str | None:
    """A tensor's size changes: one dim to an edge value, or a dim more or less."""
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.tensors(plan)) if plan else None
    if plan is None or index is None:
        return None
    tensor = plan.values[index]
    assert isinstance(tensor, P.Tensor)
    old = list(tensor.sizes)
    tensor.sizes = list(old)  # its own: the reader shares equal short lists
    action = ctx.rng.choice(["edge", "edge", "step", "add_dim", "drop_dim"])
    if action in ("edge", "step") and tensor.sizes:
        dim = ctx.rng.randrange(len(tensor.sizes))
        tensor.sizes[dim] = ctx.rng.choice(picks.EDGE_INT32) if action == "edge" \
            else tensor.sizes[dim] + ctx.rng.choice([-1, 1, 2])
    elif action == "add_dim" or not tensor.sizes:
        tensor.sizes.insert(ctx.rng.randrange(len(tensor.sizes) + 1), ctx.rng.choice([1, 2, 0]))
        if ctx.rng.random() < 0.7:  # a consistent dim order, so the check is deeper
            tensor.dim_order = list(range(len(tensor.sizes)))
    else:
        tensor.sizes.pop(ctx.rng.randrange(len(tensor.sizes)))
        if ctx.rng.random() < 0.7:
            tensor.dim_order = list(range(len(tensor.sizes)))
    return f"{plan.name} %{index} sizes {old} -> {tensor.sizes}"


@model_kind("dim_order")
def dim_order(ctx: Context) -> str | None:
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.tensors(plan)) if plan else None
    if plan is None or index is None:
        return None
    tensor = plan.values[index]
    assert isinstance(tensor, P.Tensor)
    old = list(tensor.dim_order)
    order = tensor.dim_order
    action = ctx.rng.choice(["permute", "permute", "repeat", "out_of_range", "length"])
    if action == "permute" and len(order) > 1:
        ctx.rng.shuffle(order)
    elif action == "repeat" and len(order) > 1:
        order[ctx.rng.randrange(len(order))] = order[ctx.rng.randrange(len(order))]
    elif action == "out_of_range" and order:
        order[ctx.rng.randrange(len(order))] = ctx.rng.choice([len(order), 255, 9])
    elif order and ctx.rng.random() < 0.5:
        order.pop()
    else:
        order.append(len(order))
    return f"{plan.name} %{index} dim_order {old} -> {order}"


@model_kind("tensor_fields")
def tensor_fields(ctx: Context) -> str | None:
    """The fields runtimes mostly ignore: storage offset, layout, dynamism, grad."""
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.tensors(plan)) if plan else None
    if plan is None or index is None:
        return None
    tensor = plan.values[index]
    assert isinstance(tensor, P.Tensor)
    field = ctx.rng.choice(["storage_offset", "layout", "shape_dynamism", "requires_grad"])
    old = getattr(tensor, field)
    if field == "storage_offset":
        tensor.storage_offset = ctx.rng.choice(picks.EDGE_INT32)
    elif field == "layout":
        tensor.layout = ctx.rng.choice([1, 2, 3, -1, 127])
    elif field == "shape_dynamism":
        tensor.shape_dynamism = ctx.rng.choice(list(P.TensorShapeDynamism))
    else:
        tensor.requires_grad = not tensor.requires_grad
    return f"{plan.name} %{index} {field} {old!r} -> {getattr(tensor, field)!r}"


@model_kind("values_explode")
def values_explode(ctx: Context) -> str | None:
    """Many more values than the method uses: a table a reader must not walk slowly."""
    plan = picks.plan(ctx.program, ctx.rng)
    if plan is None:
        return None
    count = ctx.rng.choice([10_000, 100_000])
    what = ctx.rng.choice(["null", "int_list", "tensor"])
    if what == "null":
        plan.values.extend(P.Null() for _ in range(count))
    elif what == "int_list":
        plan.values.append(P.IntList([0] * count))
    else:
        plan.values.extend(P.Tensor(P.ScalarType.FLOAT, [2**20], [0],
                                    allocation_info=P.AllocationDetails.at(1, 0))
                           for _ in range(count // 10))
    return f"{plan.name} values: {what} x{count}"
