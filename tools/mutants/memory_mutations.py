"""Mutations of where data lives: planned offsets and arenas, constants, segments.

These are the mutations that make two tensors share bytes, a tensor run past
its arena, or a kernel write into its own input: what a runtime must refuse
at load (or survive), since the kernels themselves never check.
"""

from __future__ import annotations

from exirc.serialize import program as P
from tools.mutants import picks
from tools.mutants.context import Context, model_kind


def _planned(plan: P.ExecutionPlan, index: int) -> P.AllocationDetails:
    value = plan.values[index]
    assert isinstance(value, P.Tensor) and value.allocation_info is not None
    return value.allocation_info


def _overlap_target(ctx: Context, plan: P.ExecutionPlan, index: int) -> int | None:
    """The offset of a tensor `index` should overlap: preferably another argument
    of an instruction that uses it (input and output of one kernel), else any
    other planned tensor."""
    partners = [arg for call in picks.kernel_calls(plan) if index in call.args
                for arg in call.args if arg != index and 0 <= arg < len(plan.values)]
    planned = set(picks.tensors(plan, planned=True))
    partners = [arg for arg in partners if arg in planned]
    other = picks.choice(ctx.rng, partners) if partners and ctx.rng.random() < 0.7 \
        else picks.choice(ctx.rng, sorted(planned - {index}))
    return _planned(plan, other).offset if other is not None else None


@model_kind("memory_offset")
def memory_offset(ctx: Context) -> str | None:
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.tensors(plan, planned=True)) if plan else None
    if plan is None or index is None:
        return None
    info = _planned(plan, index)
    tensor = plan.values[index]
    assert isinstance(tensor, P.Tensor)
    old = info.offset
    arena = plan.non_const_buffer_sizes[info.memory_id] \
        if 0 <= info.memory_id < len(plan.non_const_buffer_sizes) else 0
    action = ctx.rng.choice(["overlap", "overlap", "overlap", "shift", "end", "huge"])
    new = None
    if action == "overlap":
        target = _overlap_target(ctx, plan, index)
        if target is not None:
            new = target + ctx.rng.choice([0, 0, 4, -4, 1])
    elif action == "end":
        new = arena - tensor.nbytes + ctx.rng.choice([1, 4, 16, tensor.nbytes])
    elif action == "huge":
        new = ctx.rng.choice([2**31, 2**32 - 4, 2**32, 2**40, 2**64 - 16])
    if new is None:  # shift
        new = old + ctx.rng.choice([1, 2, 4, 8, -4, -16, 64])
    new = max(0, min(new, 2**64 - 1))
    low, high = new & 0xFFFFFFFF, new >> 32
    info.memory_offset_low, info.memory_offset_high = low, high
    return f"{plan.name} %{index} offset {old} -> {new} ({action})"


@model_kind("memory_id")
def memory_id(ctx: Context) -> str | None:
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.tensors(plan, planned=True)) if plan else None
    if plan is None or index is None:
        return None
    info = _planned(plan, index)
    old = info.memory_id
    count = len(plan.non_const_buffer_sizes)
    info.memory_id = ctx.rng.choice([0, 1, 2, count, count - 1, 2**32 - 1, 3])
    return f"{plan.name} %{index} memory_id {old} -> {info.memory_id}"


@model_kind("buffer_size")
def buffer_size(ctx: Context) -> str | None:
    """An arena's size changes: to nothing, too small, or absurdly large."""
    plan = picks.plan(ctx.program, ctx.rng)
    if plan is None or not plan.non_const_buffer_sizes:
        return None
    sizes = plan.non_const_buffer_sizes
    position = ctx.rng.randrange(len(sizes))
    old = sizes[position]
    sizes[position] = ctx.rng.choice([0, 0, old // 2, old - 1, old - 16, old + 1, 2**31,
                                      2**40, 2**62, 2**63 - 1, -1, -(2**63)])
    return f"{plan.name} non_const_buffer_sizes[{position}] {old} -> {sizes[position]}"


@model_kind("buffers_explode")
def buffers_explode(ctx: Context) -> str | None:
    """Many arenas, each small or large: a plan whose total is the problem."""
    plan = picks.plan(ctx.program, ctx.rng)
    if plan is None:
        return None
    count = ctx.rng.choice([100, 10_000, 200_000])
    each = ctx.rng.choice([0, 1, 64, 4096, 2**20])
    plan.non_const_buffer_sizes.extend([each] * count)
    return f"{plan.name} non_const_buffer_sizes: {count} more of {each} bytes"


@model_kind("data_buffer_idx")
def data_buffer_idx(ctx: Context) -> str | None:
    """A tensor reads another constant, none, or becomes constant and planned at once."""
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.tensors(plan)) if plan else None
    if plan is None or index is None:
        return None
    tensor = plan.values[index]
    assert isinstance(tensor, P.Tensor)
    old = tensor.data_buffer_idx
    count = ctx.program.constant_count()
    tensor.data_buffer_idx = ctx.rng.choice([0, 1, max(count - 1, 0), count, 2**32 - 1]
                                            + list(range(1, min(count, 8))))
    if old == 0 and tensor.allocation_info is not None and ctx.rng.random() < 0.5:
        tensor.allocation_info = None  # a planned tensor becomes constant
    return f"{plan.name} %{index} data_buffer_idx {old} -> {tensor.data_buffer_idx}"


@model_kind("allocation")
def allocation(ctx: Context) -> str | None:
    """A planned tensor loses its memory (as if supplied at run time), or a
    constant or input gains planned memory."""
    plan = picks.plan(ctx.program, ctx.rng)
    index = picks.choice(ctx.rng, picks.tensors(plan)) if plan else None
    if plan is None or index is None:
        return None
    tensor = plan.values[index]
    assert isinstance(tensor, P.Tensor)
    if tensor.allocation_info is not None:
        tensor.allocation_info = None
        return f"{plan.name} %{index} loses its planned memory"
    tensor.allocation_info = P.AllocationDetails.at(1, ctx.rng.choice([0, 16, 2**20]))
    return f"{plan.name} %{index} gains planned memory at {tensor.allocation_info.offset}"


@model_kind("constant_offsets")
def constant_offsets(ctx: Context) -> str | None:
    """Constants start elsewhere in their segment: overlapping, reversed, past the end."""
    segment = ctx.program.constant_segment
    if segment is None or len(segment.offsets) < 2:
        return None
    offsets = segment.offsets
    position = ctx.rng.randrange(1, len(offsets))
    old = offsets[position]
    size = len(ctx.program.segments[segment.segment_index].data) \
        if 0 <= segment.segment_index < len(ctx.program.segments) else 0
    offsets[position] = ctx.rng.choice([0, offsets[position - 1], size, size + 16, old + 4,
                                        old - 4 if old >= 4 else 0, 2**40, 2**64 - 1])
    return f"constant_segment.offsets[{position}] {old} -> {offsets[position]}"


@model_kind("plan_io")
def plan_io(ctx: Context) -> str | None:
    """A method's inputs or outputs name other values, repeat, or disappear."""
    plan = picks.plan(ctx.program, ctx.rng)
    if plan is None:
        return None
    which = ctx.rng.choice(["inputs", "outputs"])
    items: list[int] = getattr(plan, which)
    old = list(items)
    action = ctx.rng.choice(["replace", "repeat", "drop", "add"])
    if action == "replace" and items:
        items[ctx.rng.randrange(len(items))] = picks.any_value(plan, ctx.rng)
    elif action == "repeat" and items:
        items.append(items[0])
    elif action == "drop" and items:
        items.pop(ctx.rng.randrange(len(items)))
    else:
        items.append(picks.any_value(plan, ctx.rng))
    if ctx.rng.random() < 0.5:  # the chain's copy too, as a compiler would write it
        for chain in plan.chains:
            setattr(chain, which, list(items))
    return f"{plan.name} {which} {old} -> {items}"
