"""Elementwise nodes: unary math, activations, and broadcasting binary ops.

Each is one torch call on float32 tensors, which computes what XNNPACK's
kernels compute (up to float rounding of transcendental functions): the same
formulas (erf GELU, `x * relu6(x + 3) / 6` hardswish, `alpha * (exp(x) - 1)`
ELU for x <= 0), numpy broadcasting for binary ops, softmax over the last
dim. Binary ops and Clamp also apply the node's fused output clamp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.serialize.xnnpack import graph as G

Fn = Callable[..., torch.Tensor]

UNARY: dict[G.NodeKind, Fn] = {
    G.NodeKind.ABS: torch.abs,
    G.NodeKind.CEILING: torch.ceil,
    G.NodeKind.FLOOR: torch.floor,
    G.NodeKind.NEGATE: torch.neg,
    G.NodeKind.SQUARE: torch.square,
    G.NodeKind.SQUARE_ROOT: torch.sqrt,
    G.NodeKind.RECIPROCAL_SQUARE_ROOT: torch.rsqrt,
    G.NodeKind.LOG: torch.log,
    G.NodeKind.EXP: torch.exp,
    G.NodeKind.SIN: torch.sin,
    G.NodeKind.COS: torch.cos,
    G.NodeKind.TANH: torch.tanh,
    G.NodeKind.SIGMOID: torch.sigmoid,
    G.NodeKind.GELU: F.gelu,
    G.NodeKind.HARDSWISH: F.hardswish,
}

BINARY: dict[G.NodeKind, Fn] = {
    G.NodeKind.ADD: torch.add,
    G.NodeKind.SUBTRACT: torch.sub,
    G.NodeKind.MULTIPLY: torch.mul,
    G.NodeKind.DIV: torch.div,
    G.NodeKind.MINIMUM: torch.minimum,
    G.NodeKind.MAXIMUM: torch.maximum,
}


def unary_op(fn: Fn, a: int, out: int, clamp: tuple[float, float] | None = None,
             **kwargs: Any) -> Op:
    """`env[out] = fn(env[a], **kwargs)`, clamped if `clamp` is given."""
    if clamp is not None:
        low, high = clamp

        def run_clamped(env: Env) -> None:
            env[out] = fn(env[a], **kwargs).clamp_(low, high)
        return run_clamped
    if kwargs:
        def run_with(env: Env) -> None:
            env[out] = fn(env[a], **kwargs)
        return run_with

    def run(env: Env) -> None:
        env[out] = fn(env[a])
    return run


def binary_op(fn: Fn, a: int, b: int, out: int, clamp: tuple[float, float] | None) -> Op:
    """`env[out] = fn(env[a], env[b])`, clamped if `clamp` is given."""
    if clamp is not None:
        low, high = clamp

        def run_clamped(env: Env) -> None:
            env[out] = fn(env[a], env[b]).clamp_(low, high)
        return run_clamped

    def run(env: Env) -> None:
        env[out] = fn(env[a], env[b])
    return run


def _unary_ids(ctx: NodeContext) -> tuple[int, int]:
    params = ctx.node.params
    assert isinstance(params, G.Node1x1)
    ctx.require_float([(params.input_id, "input"), (params.output_id, "output")])
    return ctx.read(params.input_id, "input"), ctx.write(params.output_id)


def build_unary(ctx: NodeContext) -> Op:
    assert isinstance(ctx.node.params, G.Node1x1)
    ctx.check_flags(ctx.node.params.flags)
    a, out = _unary_ids(ctx)
    return unary_op(UNARY[ctx.kind], a, out)


def build_copy(ctx: NodeContext) -> Op:
    """Copy: the value itself. Values are never written in place, so sharing is safe."""
    assert isinstance(ctx.node.params, G.Node1x1)
    ctx.check_flags(ctx.node.params.flags)
    a, out = _unary_ids(ctx)

    def run(env: Env) -> None:
        env[out] = env[a]
    return run


def build_clamp(ctx: NodeContext) -> Op:
    assert isinstance(ctx.node.params, G.Node1x1)
    ctx.check_flags(ctx.node.params.flags)
    a, out = _unary_ids(ctx)
    bounds = ctx.clamp_bounds()
    if bounds is None:
        return build_copy_slots(a, out)
    low, high = bounds
    return unary_op(torch.clamp, a, out, min=low, max=high)


def build_copy_slots(a: int, out: int) -> Op:
    def run(env: Env) -> None:
        env[out] = env[a]
    return run


def build_softmax(ctx: NodeContext) -> Op:
    assert isinstance(ctx.node.params, G.Node1x1)
    ctx.check_flags(ctx.node.params.flags)
    a, out = _unary_ids(ctx)
    if not ctx.dims(ctx.node.params.input_id):
        raise ctx.fail("its input has no dims to take a softmax over")
    return unary_op(torch.softmax, a, out, dim=-1)


def build_elu(ctx: NodeContext) -> Op:
    params = ctx.node.params
    assert isinstance(params, G.ELU)
    ctx.check_flags(params.flags)
    ctx.require_float([(params.input_id, "input"), (params.output_id, "output")])
    alpha = _finite(ctx, params.alpha, "alpha")
    return unary_op(F.elu, ctx.read(params.input_id, "input"), ctx.write(params.output_id),
                    alpha=alpha)


def build_leaky_relu(ctx: NodeContext) -> Op:
    params = ctx.node.params
    assert isinstance(params, G.LeakyReLU)
    ctx.check_flags(params.flags)
    ctx.require_float([(params.input_id, "input"), (params.output_id, "output")])
    slope = _finite(ctx, params.negative_slope, "negative_slope")
    return unary_op(F.leaky_relu, ctx.read(params.input_id, "input"),
                    ctx.write(params.output_id), negative_slope=slope)


def build_binary(ctx: NodeContext) -> Op:
    params = ctx.node.params
    assert isinstance(params, G.Node2x1)
    ctx.check_flags(params.flags)
    ctx.require_float([(params.input1_id, "input 1"), (params.input2_id, "input 2"),
                     (params.output_id, "output")])
    a = ctx.read(params.input1_id, "input 1")
    b = ctx.read(params.input2_id, "input 2")
    out = ctx.write(params.output_id)
    return binary_op(BINARY[ctx.kind], a, b, out, ctx.clamp_bounds())


def build_prelu(ctx: NodeContext) -> Op:
    """PReLU: `x < 0 ? x * slope : x`, the slope ([C] or [1]) along the last (channel) dim."""
    params = ctx.node.params
    assert isinstance(params, G.Node2x1)
    ctx.check_flags(params.flags)
    ctx.require_float([(params.input1_id, "input"), (params.input2_id, "slope"),
                     (params.output_id, "output")])
    dims = ctx.dims(params.input1_id)
    slope_dims = ctx.dims(params.input2_id)
    if not dims or len(slope_dims) != 1 or slope_dims[0] not in (1, dims[-1]):
        raise ctx.fail(f"its slope has dims {slope_dims}; an input of dims {dims} takes "
                       f"[1] or [{dims[-1] if dims else '?'}]")
    x = ctx.read(params.input1_id, "input")
    slope = ctx.read(params.input2_id, "slope")
    out = ctx.write(params.output_id)

    def run(env: Env) -> None:
        value = env[x]
        env[out] = torch.where(value < 0, value * env[slope], value)
    return run


def _finite(ctx: NodeContext, number: float, name: str) -> float:
    if number != number or number in (float("inf"), float("-inf")):
        raise ctx.fail(f"its {name} is {number}")
    return float(number)


BUILDERS: dict[G.NodeKind, Callable[[NodeContext], Op]] = {
    **{kind: build_unary for kind in UNARY},
    **{kind: build_binary for kind in BINARY},
    G.NodeKind.COPY: build_copy,
    G.NodeKind.CLAMP: build_clamp,
    G.NodeKind.SOFTMAX: build_softmax,
    G.NodeKind.ELU: build_elu,
    G.NodeKind.LEAKY_RELU: build_leaky_relu,
    G.NodeKind.PRELU: build_prelu,
}
