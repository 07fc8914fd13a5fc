"""Data movement nodes: transpose, reshape, slice, constant pad, concatenate.

These never compute, so they work on float values and on statically quantized
ones (qint8, quint8) whose input and output share their quantization. The static
parameters are checked against the input's rank here; that they produce the
declared output dims is checked by the shape check at init.

  - StaticTranspose: output dim i is input dim perm[i] (torch's permute);
  - StaticReshape: a 0 in new_shape is the one dim inferred from the others
    (ExecuTorch writes -1 as 0), so a dynamic batch flows through;
  - StaticSlice: offsets and sizes per dim; a size of 0 means "to the end";
    slices past the end of the input fail instead of being cut short;
  - StaticConstantPad: pre and post paddings per dim, filled with a value;
  - Concatenate2..5: along `axis`; unused inputs are XNN_INVALID_VALUE_ID.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from exirc.runtime.delegates.xnnpack.constants import datatype_name
from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.runtime.delegates.xnnpack.quant import is_static_quantized
from exirc.serialize.xnnpack import graph as G

MAX_DIMS = 6  # XNN_MAX_TENSOR_DIMS


def _same_type(ctx: NodeContext, ids: list[tuple[int, str]]) -> None:
    """Moving data keeps datatype and quantization; refuse a node that would change them."""
    first = ctx.value(ids[0][0], ids[0][1])
    for value_id, role in ids[1:]:
        value = ctx.value(value_id, role)
        if value.datatype != first.datatype or value.quant != first.quant:
            raise ctx.fail(f"its {ids[0][1]} is {datatype_name(first.datatype)} and its {role} "
                           f"{datatype_name(value.datatype)} (or their quantization differs)")
    if not is_static_quantized(first):
        ctx.require_float(ids)


def _rank(ctx: NodeContext, value_id: int, num_dims: int, what: str) -> list[int]:
    dims = ctx.dims(value_id)
    if num_dims != len(dims):
        raise ctx.fail(f"its {what} has {num_dims} entries, but its input has {len(dims)} dims")
    return dims


def build_transpose(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.StaticTranspose)
    ctx.check_flags(p.flags)
    _same_type(ctx, [(p.input_id, "input"), (p.output_id, "output")])
    _rank(ctx, p.input_id, p.num_dims, "perm")
    perm = list(p.perm)
    if len(perm) != p.num_dims or sorted(perm) != list(range(p.num_dims)):
        raise ctx.fail(f"its perm {perm} is not a permutation of 0..{p.num_dims - 1}")
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)
    order = tuple(perm)

    def run(env: Env) -> None:
        env[out] = env[x].permute(order)
    return run


def build_reshape(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.StaticReshape)
    ctx.check_flags(p.flags)
    _same_type(ctx, [(p.input_id, "input"), (p.output_id, "output")])
    shape = list(p.new_shape)
    if len(shape) != p.num_dims or p.num_dims > MAX_DIMS:
        raise ctx.fail(f"its new_shape {shape} does not have num_dims ({p.num_dims}) entries "
                       f"(at most {MAX_DIMS})")
    if shape.count(0) > 1:
        raise ctx.fail(f"its new_shape {shape} leaves more than one dim (0) to infer")
    target = tuple(-1 if d == 0 else d for d in shape)
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)

    def run(env: Env) -> None:
        env[out] = env[x].reshape(target)
    return run


def build_slice(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.StaticSlice)
    ctx.check_flags(p.flags)
    _same_type(ctx, [(p.input_id, "input"), (p.output_id, "output")])
    dims = _rank(ctx, p.input_id, p.num_dims, "offsets")
    offsets, sizes = list(p.offsets), list(p.sizes)
    if len(offsets) != p.num_dims or len(sizes) != p.num_dims:
        raise ctx.fail(f"its offsets {offsets} and sizes {sizes} must have {p.num_dims} "
                       "entries each")
    for d, (offset, size, extent) in enumerate(zip(offsets, sizes, dims)):
        if offset + size > extent or (size == 0 and offset >= extent):
            raise ctx.fail(f"it slices [{offset}, {offset + size}) of dim {d}, which has "
                           f"{extent} elements")
    # (dim, start, length; 0 for "to the end"), for every dim not taken whole. A
    # dim taken whole at init is still checked at run time: an input that
    # shrank (a dynamic dim) fails instead of giving a short slice.
    spec = [(d, o, s) for d, (o, s) in enumerate(zip(offsets, sizes)) if o or s]
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)

    def run(env: Env) -> None:
        value: torch.Tensor = env[x]
        for d, start, length in spec:
            extent = value.shape[d]
            count = extent - start if length == 0 else length
            if start or count != extent:
                value = value.narrow(d, start, count)  # raises past the end
        env[out] = value
    return run


def build_constant_pad(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.StaticConstantPad)
    ctx.check_flags(p.flags)
    _same_type(ctx, [(p.input_id, "input"), (p.output_id, "output")])
    dims = ctx.dims(p.input_id)
    before, after = list(p.pre_paddings), list(p.post_paddings)
    if len(before) != len(dims) or len(after) != len(dims):
        raise ctx.fail(f"its paddings {before} / {after} must have one entry per input dim "
                       f"({len(dims)})")
    if p.padding_value != p.padding_value:
        raise ctx.fail("its padding value is NaN")
    # F.pad takes (before, after) pairs from the last dim backwards.
    pad: list[int] = []
    for b, a in zip(reversed(before), reversed(after)):
        pad += [b, a]
    value = float(p.padding_value)
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)

    def run(env: Env) -> None:
        env[out] = F.pad(env[x], pad, value=value)
    return run


CONCAT_INPUTS = {G.NodeKind.CONCATENATE2: 2, G.NodeKind.CONCATENATE3: 3,
                 G.NodeKind.CONCATENATE4: 4, G.NodeKind.CONCATENATE5: 5}


def build_concatenate(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.Concatenate)
    ctx.check_flags(p.flags)
    count = CONCAT_INPUTS[ctx.kind]
    ids = [p.input1_id, p.input2_id, p.input3_id, p.input4_id, p.input5_id]
    used, unused = ids[:count], ids[count:]
    if any(value_id != G.INVALID_VALUE_ID for value_id in unused):
        raise ctx.fail(f"a concatenation of {count} inputs names a {count + 1}th")
    roles = [(value_id, f"input {i + 1}") for i, value_id in enumerate(used)]
    _same_type(ctx, [*roles, (p.output_id, "output")])
    rank = len(ctx.dims(used[0]))
    if not 0 <= p.axis < rank:
        raise ctx.fail(f"its axis {p.axis} is not a dim of its {rank}-D inputs")
    slots = [ctx.read(value_id, role) for value_id, role in roles]
    out = ctx.write(p.output_id)
    axis = p.axis

    def run(env: Env) -> None:
        env[out] = torch.cat([env[slot] for slot in slots], axis)
    return run


BUILDERS: dict[G.NodeKind, Callable[[NodeContext], Op]] = {
    G.NodeKind.STATIC_TRANSPOSE: build_transpose,
    G.NodeKind.STATIC_RESHAPE: build_reshape,
    G.NodeKind.STATIC_SLICE: build_slice,
    G.NodeKind.STATIC_CONSTANT_PAD: build_constant_pad,
    **{kind: build_concatenate for kind in CONCAT_INPUTS},
}
