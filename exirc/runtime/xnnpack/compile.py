"""Compiling an XNNPACK graph into a list of closures, checked at init.

`compile_graph` does everything a call should not have to: it gives each
value a slot in the value table, resolves constants to tensors, binds the
delegate's arguments to the external values, and turns each node into a
closure over precomputed parameters (see the builder modules). It then runs
the closures once on meta tensors (shapes only, no memory) of the declared
dims, and checks that every node produces exactly the dims and datatype
its output values declare. A blob whose nodes contradict its values (a
filter that does not fit its convolution, a reshape that changes the element
count, a slice past the end) is refused here with a `FormatError`, before
anything runs; `execute` then only has to follow the list.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from exirc.errors import FormatError, UnsupportedOperatorError
from exirc.runtime.arenas import available_memory
from exirc.runtime.xnnpack import attention, elementwise, linear, pooling, shapes
from exirc.runtime.xnnpack.constants import (
    FLOAT_TYPES,
    STORAGE_TYPES,
    ConstantSource,
    datatype_name,
)
from exirc.runtime.xnnpack.context import Env, NodeContext, Op
from exirc.runtime.xnnpack.convert import build_convert
from exirc.runtime.xnnpack.shapes import MAX_DIMS
from exirc.serialize.xnnpack import graph as G

Builder = Callable[[NodeContext], Op]

BUILDERS: dict[G.NodeKind, Builder] = {
    **elementwise.BUILDERS,
    **linear.BUILDERS,
    **pooling.BUILDERS,
    **shapes.BUILDERS,
    **attention.BUILDERS,
    G.NodeKind.CONVERT: build_convert,
}
"""How each node kind becomes a closure."""

NARROW = (torch.float16, torch.bfloat16)

MOVES_DATA = frozenset({*shapes.BUILDERS, G.NodeKind.COPY, G.NodeKind.CONVERT})
"""Kinds that only move data (or convert it exactly): never widened to float32."""

EXTERNAL_TYPES = {**FLOAT_TYPES, G.Datatype.INT32: torch.int32}
"""The datatypes a delegate's arguments may have (quantized ones are internal)."""


@dataclass(frozen=True)
class External:
    """One delegate argument: its position, its value's slot, what it must be."""

    arg: int
    slot: int
    value_id: int
    dtype: torch.dtype
    dims: tuple[int, ...]


@dataclass(frozen=True)
class CompiledGraph:
    """A graph ready to run: its closures, the value table to start each call
    from (constants filled in), and where its inputs and outputs are."""

    ops: list[Op]
    labels: list[str]  # "node 3 (conv2d)", parallel to ops, for messages
    template: Env
    inputs: list[External]
    outputs: list[External]
    num_args: int


def compile_graph(graph: G.XNNGraph, source: ConstantSource) -> CompiledGraph:
    """Check `graph` and compile it; constants come from `source`."""
    where = source.where
    slots = _slots(graph, where)
    _check_sizes(graph, where)
    constants = {v.id_out: source.tensor(v) for v in graph.values if v.constant_buffer_idx}
    inputs, outputs = _externals(graph, slots, where)
    # The shape check: the same builders over meta tensors of the declared dims.
    meta = {value_id: torch.empty(t.shape, dtype=t.dtype, device="meta")
            for value_id, t in constants.items()}
    meta_ops, _, written = _build(graph, slots, meta, inputs, where)
    _check_shapes(graph, slots, meta_ops, written, meta, inputs, where)
    ops, labels, _ = _build(graph, slots, constants, inputs, where)
    template: Env = [None] * len(graph.values)
    for value_id, tensor in constants.items():
        template[slots[value_id][0]] = tensor
    return CompiledGraph(ops, labels, template, inputs, outputs, len(inputs) + len(outputs))


def _slots(graph: G.XNNGraph, where: str) -> dict[int, tuple[int, G.TensorValue]]:
    """Each value's slot (its position in the values), by id."""
    slots: dict[int, tuple[int, G.TensorValue]] = {}
    for i, value in enumerate(graph.values):
        if value.id_out in slots or value.id_out == G.INVALID_VALUE_ID:
            raise FormatError(f"values[{i}] has id {value.id_out}, which is invalid or "
                              "used twice", field=f"{where}.values")
        slots[value.id_out] = (i, value)
    return slots


def _externals(graph: G.XNNGraph, slots: dict[int, tuple[int, G.TensorValue]],
               where: str) -> tuple[list[External], list[External]]:
    """The delegate's arguments: value `input_ids[i]` is argument `external_id`, as
    in ExecuTorch's runtime; inputs and outputs together number the arguments 0..n-1."""
    result: list[list[External]] = []
    for ids, flag, role in ((graph.input_ids, G.FLAG_EXTERNAL_INPUT, "input"),
                            (graph.output_ids, G.FLAG_EXTERNAL_OUTPUT, "output")):
        flagged = {v.id_out for v in graph.values if v.flags & flag}
        if len(set(ids)) != len(ids) or set(ids) != flagged:
            raise FormatError(f"the {role} ids {list(ids)} are not exactly the values flagged "
                              f"as external {role}s ({sorted(flagged)})",
                              field=f"{where}.{role}_ids")
        externals = []
        for value_id in ids:
            slot, value = slots[value_id]
            if value.constant_buffer_idx:
                raise FormatError(f"external {role} {value_id} is a constant",
                                  field=f"{where}.{role}_ids")
            dtype = EXTERNAL_TYPES.get(value.datatype)
            if dtype is None or value.quant is not None:
                raise UnsupportedOperatorError(
                    f"XNNPACK delegate {role} {value_id} has datatype "
                    f"{datatype_name(value.datatype)}; exirc's XNNPACK backend takes float "
                    "(and int32) inputs and outputs only")
            externals.append(External(value.external_id, slot, value_id, dtype,
                                      tuple(value.dims)))
        result.append(externals)
    inputs, outputs = result
    args = sorted(e.arg for e in inputs + outputs)
    if args != list(range(len(args))):
        raise FormatError(f"the external ids of the inputs and outputs are {args}; they must "
                          f"number the delegate's arguments 0 to {len(args) - 1}",
                          field=f"{where}.values")
    both = {e.value_id for e in inputs} & {e.value_id for e in outputs}
    if both:
        raise FormatError(f"values {sorted(both)} are both external inputs and outputs",
                          field=f"{where}.values")
    return inputs, outputs


def _build(graph: G.XNNGraph, slots: dict[int, tuple[int, G.TensorValue]],
           constants: dict[int, torch.Tensor], inputs: list[External], where: str
           ) -> tuple[list[Op], list[str], list[list[int]]]:
    defined = {slots[value_id][0] for value_id in constants} | {e.slot for e in inputs}
    # Nodes compute in float32: fp16 and bf16 constants are converted once, here.
    computed = {value_id: t.float() if t.dtype in NARROW else t
                for value_id, t in constants.items()}
    ops, labels, written = [], [], []
    for i, node in enumerate(graph.nodes):
        ctx = NodeContext(i, node, slots, defined, computed, f"{where}.nodes[{i}]")
        builder = BUILDERS.get(node.kind)
        if builder is None:
            raise ctx.unsupported("exirc does not implement this node kind")
        expected = G.PARAMS_OF_KIND.get(node.kind)
        if expected is None or not isinstance(node.params, expected):
            raise ctx.fail(f"its parameters are a {type(node.params).__name__}")
        op = builder(ctx)
        if ctx.narrow and node.kind not in MOVES_DATA:
            op = _narrow(op, ctx.reads, [(slot, STORAGE_TYPES[graph.values[slot].datatype])
                                         for slot in ctx.written])
        ops.append(op)
        labels.append(ctx.label)
        written.append(ctx.written)
    for value_id in graph.output_ids:
        if slots[value_id][0] not in defined:
            raise FormatError(f"external output {value_id} is never written by a node",
                              field=f"{where}.output_ids")
    return ops, labels, written


def _narrow(op: Op, reads: list[int], writes: list[tuple[int, torch.dtype]]) -> Op:
    """`op` (which computes in float32) on a node with fp16 or bf16 values: its inputs
    are read as float32 and its outputs rounded to their own type.

    XNNPACK's fp16 kernels also compute elementwise functions in float32; its
    matrix kernels may round partial sums to fp16 along the way, so results can
    differ from it in the last bits of fp16."""
    reads = list(dict.fromkeys(reads))

    def run(env: Env) -> None:
        saved = [env[slot] for slot in reads]
        for slot, value in zip(reads, saved):
            if value.dtype in NARROW:
                env[slot] = value.float()
        try:
            op(env)
        finally:
            for slot, value in zip(reads, saved):
                env[slot] = value
        for slot, dtype in writes:
            env[slot] = env[slot].to(dtype)
    return run


def _check_shapes(graph: G.XNNGraph, slots: dict[int, tuple[int, G.TensorValue]],
                  ops: list[Op], written: list[list[int]], constants: dict[int, torch.Tensor],
                  inputs: list[External], where: str) -> None:
    env: list[Any] = [None] * len(graph.values)
    for value_id, tensor in constants.items():
        env[slots[value_id][0]] = tensor
    for e in inputs:
        env[e.slot] = torch.empty(e.dims, dtype=e.dtype, device="meta")
    for i, (op, slots_written) in enumerate(zip(ops, written)):
        label = f"node {i} ({graph.nodes[i].kind.name.lower()})"
        try:
            op(env)
        except Exception as error:  # noqa: BLE001 (torch's shape checks, any kind)
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise FormatError(f"{label} does not fit its values' dims: {detail}",
                              field=f"{where}.nodes[{i}]") from None
        for slot in slots_written:
            value = graph.values[slot]
            result = env[slot]
            declared = list(value.dims)
            if not isinstance(result, torch.Tensor) or list(result.shape) != declared:
                shape = list(result.shape) if isinstance(result, torch.Tensor) else result
                raise FormatError(f"{label} produces dims {shape} for value {value.id_out}, "
                                  f"which declares {declared}", field=f"{where}.nodes[{i}]")
            expected = STORAGE_TYPES.get(value.datatype)
            if result.dtype != expected:
                raise FormatError(f"{label} produces {result.dtype} for value {value.id_out}, "
                                  f"which is {datatype_name(value.datatype)}",
                                  field=f"{where}.nodes[{i}]")


def _check_sizes(graph: G.XNNGraph, where: str) -> None:
    """Refuse values larger than the memory there is, before a call tries to allocate them:
    a hostile blob can declare terabytes in a few bytes."""
    limit = available_memory()
    if limit is None:
        return
    for i, value in enumerate(graph.values):
        if len(value.dims) > MAX_DIMS:
            raise FormatError(f"value {value.id_out} has {len(value.dims)} dims; XNNPACK "
                              f"tensors have at most {MAX_DIMS}", field=f"{where}.values[{i}]")
        nbytes = math.prod(value.dims) * STORAGE_TYPES.get(value.datatype, torch.uint8).itemsize
        if nbytes > limit:
            raise FormatError(f"value {value.id_out} has dims {list(value.dims)}: {nbytes} "
                              f"bytes, more than the {limit} bytes of memory available",
                              field=f"{where}.values[{i}]")
