"""Compiling an XNNPACK graph into a list of closures, checked at init.

`compile_graph` does everything a call should not have to: it gives each
value a slot in the value table, resolves constants to tensors, binds the
delegate's arguments to the external values, rewrites the graph as XNNPACK's
own optimizer would where that changes results (`fuse.py`, and per-pixel
quantization for pointwise convolutions), and turns each node into a closure
over precomputed parameters (see the builder modules). Each closure is run
once on meta tensors as it is built (`shapecheck.py`), so shapes are
inferred from the inputs as XNNPACK infers them, and a node that cannot run
on them is refused with a `FormatError` before anything runs. `execute`
(`run.py`) then only has to follow the list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from exirc.errors import ExircError, FormatError, UnsupportedOperatorError
from exirc.runtime.delegates.xnnpack import (
    attention,
    elementwise,
    linear,
    pooling,
    qlinear,
    qother,
    shapes,
)
from exirc.runtime.delegates.xnnpack.constants import (
    FLOAT_TYPES,
    STORAGE_TYPES,
    ConstantSource,
    datatype_name,
)
from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.runtime.delegates.xnnpack.convert import build_convert
from exirc.runtime.delegates.xnnpack.fuse import fuse_clamps
from exirc.runtime.delegates.xnnpack.quant import (
    STATIC_TYPES,
    build_quantized_convert,
    is_static_quantized,
)
from exirc.runtime.delegates.xnnpack.shapecheck import ShapeCheck
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

QUANTIZED_BUILDERS: dict[G.NodeKind, Builder] = {
    **qlinear.BUILDERS,
    **qother.BUILDERS,
    G.NodeKind.CONVERT: build_quantized_convert,
}
"""Builders for nodes with quantized values (data movement handles them itself; every
other kind refuses them by name)."""

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
    # Each value's dims by id, as the shape check inferred them from the inputs
    # (a blob's declared dims for internal values are only a hint: `shapecheck`).
    shapes: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # The checked graph it was compiled from, for an engine that translates it.
    graph: G.XNNGraph | None = None


def compile_graph(graph: G.XNNGraph, source: ConstantSource) -> CompiledGraph:
    """Check `graph` and compile it; constants come from `source`."""
    where = source.where
    nodes = fuse_clamps(graph)
    slots = _pointwise_dynamic_inputs(nodes, _slots(graph, where))
    constants = {v.id_out: source.tensor(v) for v in graph.values if v.constant_buffer_idx}
    inputs, outputs = _externals(graph, slots, where)
    # Built twice: first over meta tensors, each node run as it is built (the shape
    # check, which also infers the shapes builders see); then over the real weights.
    meta = {value_id: torch.empty(t.shape, dtype=t.dtype, device="meta")
            for value_id, t in constants.items()}
    check = ShapeCheck(graph, slots, meta, [(e.slot, e.dtype, e.dims) for e in inputs], where)
    _build(graph, nodes, slots, meta, inputs, source, check.shapes, check)
    for external in outputs:
        check.check_output(external.slot)
    ops, labels = _build(graph, nodes, slots, constants, inputs, source, check.shapes, None)
    template: Env = [None] * len(graph.values)
    for value_id, tensor in constants.items():
        template[slots[value_id][0]] = tensor
    shapes = {graph.values[slot].id_out: dims for slot, dims in check.shapes.items()}
    return CompiledGraph(ops, labels, template, inputs, outputs, len(inputs) + len(outputs),
                         shapes, graph)


Slots = dict[int, tuple[int, G.TensorValue]]


def _slots(graph: G.XNNGraph, where: str) -> Slots:
    """Each value's slot (its position in the values), by id."""
    slots: dict[int, tuple[int, G.TensorValue]] = {}
    for i, value in enumerate(graph.values):
        if value.id_out in slots or value.id_out == G.INVALID_VALUE_ID:
            raise FormatError(f"values[{i}] has id {value.id_out}, which is invalid or "
                              "used twice", field=f"{where}.values")
        slots[value.id_out] = (i, value)
    return slots


def _pointwise_dynamic_inputs(nodes: list[tuple[int, G.Node]], slots: Slots) -> Slots:
    """XNNPACK runs a 1x1, unit-stride, unpadded, ungrouped convolution as a matrix
    product, and then quantizes its dynamically quantized input per pixel (as for a
    fully connected node) whatever `num_nonbatch_dims` the blob says; so do we."""
    result = dict(slots)
    for _, node in nodes:
        p = node.params
        if node.kind != G.NodeKind.CONV2D or not isinstance(p, G.Conv):
            continue
        entry = result.get(p.input1_id)
        pointwise = (p.kernel_height == p.kernel_width == p.subsampling_height
                     == p.subsampling_width == p.groups == 1
                     and not (p.padding_top or p.padding_right or p.padding_bottom
                              or p.padding_left))
        if entry is not None and pointwise and isinstance(entry[1].quant,
                                                          G.PerTokenDynamicQuant):
            value = dataclasses.replace(entry[1], quant=G.PerTokenDynamicQuant(1))
            result[p.input1_id] = (entry[0], value)
    return result


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
            if is_static_quantized(value):  # integers, e.g. a quantized constant of the program
                dtype = STATIC_TYPES[value.datatype]
            elif value.quant is not None:
                dtype = None
            if dtype is None:
                raise UnsupportedOperatorError(
                    f"XNNPACK delegate {role} {value_id} has datatype "
                    f"{datatype_name(value.datatype)}; exirc's XNNPACK backend takes float, "
                    "int32 and per-tensor quantized inputs and outputs only")
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


def _build(graph: G.XNNGraph, nodes: list[tuple[int, G.Node]], slots: Slots,
           constants: dict[int, torch.Tensor], inputs: list[External], source: ConstantSource,
           shapes: dict[int, tuple[int, ...]], check: ShapeCheck | None
           ) -> tuple[list[Op], list[str]]:
    where = source.where
    defined = {slots[value_id][0] for value_id in constants} | {e.slot for e in inputs}
    # Nodes compute in float32: fp16 and bf16 constants are converted once, here.
    computed = {value_id: t.float() if t.dtype in NARROW else t
                for value_id, t in constants.items()}
    ops, labels = [], []
    for i, node in nodes:
        ctx = NodeContext(i, node, slots, defined, computed, f"{where}.nodes[{i}]", source,
                          shapes)
        builder = BUILDERS.get(node.kind)
        if _quantized(node, slots) and node.kind in QUANTIZED_BUILDERS:
            builder = QUANTIZED_BUILDERS[node.kind]
        if builder is None:
            raise ctx.unsupported("exirc does not implement this node kind")
        expected = G.PARAMS_OF_KIND.get(node.kind)
        if expected is None or not isinstance(node.params, expected):
            raise ctx.fail(f"its parameters are a {type(node.params).__name__}")
        try:
            op = builder(ctx)
        except ExircError:
            raise
        except Exception as error:  # noqa: BLE001 (torch on a hostile value: still the file's)
            detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ctx.fail(f"cannot be compiled: {type(error).__name__}: {detail}") from None
        if ctx.narrow and node.kind not in MOVES_DATA:
            op = _narrow(op, ctx.reads, [(slot, STORAGE_TYPES[graph.values[slot].datatype])
                                         for slot in ctx.written])
        if check is not None:
            check.after(i, ctx.label, op, ctx.written)
        ops.append(op)
        labels.append(ctx.label)
    for value_id in graph.output_ids:
        if slots[value_id][0] not in defined:
            raise FormatError(f"external output {value_id} is never written by a node",
                              field=f"{where}.output_ids")
    return ops, labels


def _quantized(node: G.Node, slots: dict[int, tuple[int, G.TensorValue]]) -> bool:
    """Whether any value the node names is quantized."""
    for field in dataclasses.fields(node.params):
        if field.name.endswith("_id"):
            entry = slots.get(getattr(node.params, field.name))
            if entry is not None and entry[1].datatype not in EXTERNAL_TYPES:
                return True
    return False


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
