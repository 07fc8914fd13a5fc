"""The quantized values of an XNNPACK payload, for `exirc inspect`.

XNNPACK graphs keep quantization on the values themselves: a quantized
datatype (`qint8` activations, `qcint8`/`qcint4` per-channel and `qbint4`
per-block weights, `qdint8` activations quantized at run time) with its
parameters. A per-tensor value holds its scale and zero point; per-channel
and per-block scales are inline or, as ExecuTorch writes them, a constant
(fp32 per channel, bf16 per block) in named data or the payload's constant
region. Per-channel and per-block weights are symmetric: their zero point
is not stored. The reader has validated the graph, so counts agree with the
dims; the bytes of a named constant may still be missing from the program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy

from exirc.inspector.delegates import Payload, xnn_type
from exirc.inspector.quantization_params import (
    CONSTANT,
    IMPLICIT,
    LITERAL,
    RUN_TIME,
    UNKNOWN,
    Params,
    QuantizedTensor,
    Use,
    decode,
)
from exirc.serialize.program import ScalarType
from exirc.serialize.xnnpack import graph as G

D = G.Datatype
_INT32 = (-(2 ** 31), 2 ** 31 - 1)
# The integers each quantized datatype holds. qcint4/qbint4 store nibbles
# offset by 8 (XNNPACK's kernel zero point); the values they mean are -8..7.
RANGES: dict[G.Datatype, tuple[int, int]] = {
    D.QINT8: (-128, 127), D.QUINT8: (0, 255), D.QINT32: _INT32, D.QCINT8: (-128, 127),
    D.QCINT32: _INT32, D.QCINT4: (-8, 7), D.QDINT8: (-128, 127), D.QBINT4: (-8, 7),
}
QUANTIZED = frozenset(RANGES) | {D.QPINT8}


def payload_tensors(payload: Payload, named: Mapping[str, bytes | memoryview]
                    ) -> list[QuantizedTensor]:
    """The quantized values of a payload that reads, in value order; `named`
    is the program's named data by key."""
    if payload.blob is None:
        return []
    graph = payload.blob.graph
    uses = _uses(graph)
    found = []
    for value in graph.values:
        dynamic_input = value.dq_datatype not in (D.INVALID, 0)
        if value.quant is None and value.datatype not in QUANTIZED and not dynamic_input:
            continue
        # An fp32 value with a dq_datatype is quantized by XNNPACK as it runs.
        datatype = value.dq_datatype if dynamic_input else value.datatype
        tensor = _describe(payload, value, named)
        tensor.dtype = _name(datatype)
        if tensor.quant_min is None and datatype in RANGES:
            tensor.quant_min, tensor.quant_max = RANGES[G.Datatype(datatype)]
        tensor.dynamic = tensor.dynamic or dynamic_input
        tensor.uses = uses.get(value.id_out, [])
        found.append(tensor)
    return found


def _describe(payload: Payload, value: G.TensorValue,
              named: Mapping[str, bytes | memoryview]) -> QuantizedTensor:
    quant = value.quant
    unknown = Params(UNKNOWN)
    tensor = QuantizedTensor(method=payload.method, delegate=payload.index,
                             xnnpack_value=value.id_out, type=xnn_type(value), dtype=None,
                             scheme=None, scale=unknown, zero_point=unknown,
                             origin=_origin(value))
    if isinstance(quant, G.PerTensorQuant):
        tensor.scheme = "per_tensor"
        tensor.scale = Params.literal(quant.scale)
        tensor.zero_point = Params.literal(quant.zero_point)
    elif isinstance(quant, G.PerTokenDynamicQuant):
        tensor.scheme, tensor.dynamic = "per_token", True
        tensor.scale = tensor.zero_point = Params(RUN_TIME)
    elif isinstance(quant, G.PerChannelQuant):
        tensor.scheme, tensor.axis = "per_channel", quant.channel_dim
        tensor.scale = _scales(payload, quant, _count(value, quant), named)
        tensor.zero_point = Params(IMPLICIT, count=1, values=[0], min=0, max=0)
    elif isinstance(quant, G.PerChannelGroupQuant):
        tensor.scheme, tensor.axis = "per_group", quant.channel_dim
        tensor.group_size = quant.group_size
        tensor.scale = _scales(payload, quant, _count(value, quant), named)
        tensor.zero_point = Params(IMPLICIT, count=1, values=[0], min=0, max=0)
    elif value.dq_datatype not in (D.INVALID, 0):
        tensor.scale = tensor.zero_point = Params(RUN_TIME)
    return tensor


def _count(value: G.TensorValue, quant: G.PerChannelQuant | G.PerChannelGroupQuant
           ) -> int | None:
    """How many scales the value's dims call for (None if they do not say)."""
    dims = value.dims
    if isinstance(quant, G.PerChannelGroupQuant):
        if len(dims) != 2 or quant.group_size <= 0:
            return None
        return dims[0] * (dims[1] // quant.group_size)
    return dims[quant.channel_dim] if 0 <= quant.channel_dim < len(dims) else None


def _scales(payload: Payload, quant: G.PerChannelQuant | G.PerChannelGroupQuant,
            count: int | None, named: Mapping[str, bytes | memoryview]) -> Params:
    if not quant.scale_buffer_idx:  # inline: the value itself holds them
        array = numpy.array(quant.scale, dtype=numpy.float64)
        return Params.of_array(LITERAL, array, len(quant.scale))
    assert payload.blob is not None
    entries = payload.blob.graph.constant_data
    if count is None or not 0 < quant.scale_buffer_idx < len(entries):
        return Params(CONSTANT, count=count)
    entry = entries[quant.scale_buffer_idx]
    if entry.is_named:
        data = named.get(entry.named_key)
    else:
        region = memoryview(payload.blob.constant_region).cast("B")
        data = region[entry.offset:entry.offset + entry.size] \
            if 0 <= entry.offset <= len(region) else None
    if data is None:
        return Params(CONSTANT, count=count)
    # XNNPACK reads block scales as bf16, channel scales as fp32.
    kind = "bf16" if isinstance(quant, G.PerChannelGroupQuant) else ScalarType.FLOAT
    return Params.of_array(CONSTANT, decode(data, kind, count), count)


def _origin(value: G.TensorValue) -> str:
    if value.constant_buffer_idx:
        return "constant"
    return "input" if value.flags & G.FLAG_EXTERNAL_INPUT else "computed"


def _uses(graph: G.XNNGraph) -> dict[int, list[Use]]:
    """Value id -> the nodes naming it (fields `*_id`; `output*` ones write it)."""
    uses: dict[int, list[Use]] = {}
    for n, node in enumerate(graph.nodes):
        kind = node.kind.name.lower()
        for f in dataclasses.fields(node.params):
            if not f.name.endswith("_id"):
                continue
            ident = getattr(node.params, f.name)
            uses.setdefault(ident, []).append(
                Use(f.name[:-3], f.name.startswith("output"), node=n, kind=kind))
    return uses


def _name(datatype: G.Datatype | int) -> str:
    try:
        return G.Datatype(datatype).name.lower()
    except ValueError:
        return f"#{int(datatype)}"
