"""The checks a runtime relies on before it hands an XNNPACK graph to XNNPACK.

The reader checks that the bytes decode; this module checks that what they
decode to holds together, so that a runtime can index by id, read constant
bytes and allocate tensors without checking again:

- values: datatypes are real types; ranks are at most XNNPACK's limit and
  element counts are bounded; `id_out`s are unique and dense (0..n-1, as
  every writer assigns them), so a runtime may keep values in a list; flags
  are only input/output bits; run-time quantization (`dq_datatype`) is only
  to QINT8 and only of an input; quantization scales exist for every channel
  or block XNNPACK will read;
- externals: `input_ids`/`output_ids` name values flagged as inputs/outputs,
  every flagged value is listed, and external ids are unique and below
  `num_externs` (XNNPACK reserves exactly that many; ExecuTorch's runtime
  allows at most 4096);
- constants: `constant_buffer_idx` indexes `constant_data`; each entry is
  either inside the constant region or a named-data key (exactly one), and
  holds at least the bytes its values need;
- nodes: the parameter table fits the kind, every id read or written is a
  value (INVALID_VALUE_ID only for an absent bias or mask and for unused
  concatenation inputs), and shape parameters match the ranks they act on.

It also checks every number fits its wire type, so the writer calls it
first and never fails halfway through building the bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from exirc.errors import FormatError
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.layout import PARAM_LAYOUTS, UINT32_MAX, UINT64_MAX

# XNN_MAX_TENSOR_DIMS: XNNPACK rejects tensors of higher rank.
MAX_DIMS = 6
# Elements of one tensor; far above any real delegate, far below overflow.
MAX_ELEMENTS = 2**31 - 1
# ExecuTorch's runtime refuses more external values than this.
MAX_EXTERNS = 4096
_FLOAT32_MAX = 3.4028234663852886e38
_INT32 = (-(2**31), 2**31 - 1)
_UINT32 = (0, UINT32_MAX)
_UINT64 = (0, UINT64_MAX)

# Bits per element of the datatypes whose constants have a plain size.
_BITS = {G.Datatype.FP32: 32, G.Datatype.FP16: 16, G.Datatype.BF16: 16,
         G.Datatype.QINT8: 8, G.Datatype.QUINT8: 8, G.Datatype.QINT32: 32,
         G.Datatype.QCINT8: 8, G.Datatype.QCINT32: 32, G.Datatype.QCINT4: 4,
         G.Datatype.QDINT8: 8, G.Datatype.QBINT4: 4, G.Datatype.INT32: 32}

_CONCAT_INPUTS = {G.NodeKind.CONCATENATE2: 2, G.NodeKind.CONCATENATE3: 3,
                  G.NodeKind.CONCATENATE4: 4, G.NodeKind.CONCATENATE5: 5}
_OPTIONAL_IDS = ("bias_id", "mask_id")
_IO = G.FLAG_EXTERNAL_INPUT | G.FLAG_EXTERNAL_OUTPUT
ROOT = "graph"


def _int(value: Any, bounds: tuple[int, int], path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise FormatError(f"{value!r} is not an integer", field=path)
    if not bounds[0] <= value <= bounds[1]:
        raise FormatError(f"{value} is outside [{bounds[0]}, {bounds[1]}]", field=path)
    return value


def _float(value: Any, path: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FormatError(f"{value!r} is not a number", field=path)
    if math.isfinite(value) and abs(value) > _FLOAT32_MAX:
        raise FormatError(f"{value} does not fit a float32", field=path)


def _ints(values: Any, bounds: tuple[int, int], path: str) -> Sequence[int]:
    if not isinstance(values, (list, tuple)):
        raise FormatError(f"{values!r} is not a list", field=path)
    for i, v in enumerate(values):
        _int(v, bounds, f"{path}[{i}]")
    return values


def _datatype(value: Any, path: str, allow_invalid: bool) -> G.Datatype:
    try:
        datatype = G.Datatype(value)
    except ValueError:
        raise FormatError(f"{value!r} is not a valid XNNDatatype", field=path) from None
    if datatype is G.Datatype.INVALID and not allow_invalid:
        raise FormatError("a value cannot have the invalid datatype", field=path)
    return datatype


def validate_graph(blob: G.XnnpackBlob) -> None:
    """Raise `FormatError` (naming the field) unless the blob is sound."""
    graph = blob.graph
    if not isinstance(graph.version, str):
        raise FormatError(f"{graph.version!r} is not a string", field=f"{ROOT}.version")
    if _int(graph.num_externs, _UINT32, f"{ROOT}.num_externs") > MAX_EXTERNS:
        raise FormatError(f"{graph.num_externs} is above the limit of {MAX_EXTERNS}",
                          field=f"{ROOT}.num_externs")
    _check_constant_data(graph.constant_data, len(blob.constant_region))
    values = _check_values(graph)
    _check_externals(graph, values)
    for i, node in enumerate(graph.nodes):
        _check_node(node, values, f"{ROOT}.xnodes[{i}]")


def _check_constant_data(entries: list[G.ConstantDataOffset], region_size: int) -> None:
    for i, entry in enumerate(entries):
        path = f"{ROOT}.constant_data[{i}]"
        if not isinstance(entry, G.ConstantDataOffset):
            raise FormatError(f"{type(entry).__name__} is not a ConstantDataOffset", field=path)
        offset = _int(entry.offset, _UINT64, f"{path}.offset")
        size = _int(entry.size, _UINT64, f"{path}.size")
        if not isinstance(entry.named_key, str):
            raise FormatError(f"{entry.named_key!r} is not a string", field=f"{path}.named_key")
        if entry.named_key:
            if offset != G.NAMED_DATA_OFFSET:
                raise FormatError(
                    f"has both a named key and an offset ({offset}); a named constant's "
                    f"offset must be {G.NAMED_DATA_OFFSET:#x}", field=f"{path}.offset")
        elif offset == G.NAMED_DATA_OFFSET:
            raise FormatError("offset says named data, but the named key is empty",
                              field=f"{path}.named_key")
        elif offset + size > region_size:
            raise FormatError(
                f"[{offset}, {offset + size}) runs past the {region_size}-byte constant region",
                field=f"{path}.size")


def _check_values(graph: G.XNNGraph) -> dict[int, G.TensorValue]:
    """The values by id, each checked on its own."""
    values: dict[int, G.TensorValue] = {}
    count = len(graph.values)
    for i, v in enumerate(graph.values):
        path = f"{ROOT}.xvalues[{i}]"
        if not isinstance(v, G.TensorValue):
            raise FormatError(f"{type(v).__name__} is not a TensorValue", field=path)
        id_out = _int(v.id_out, _UINT32, f"{path}.id_out")
        if id_out >= count:
            raise FormatError(f"id {id_out} is not below the number of values ({count})",
                              field=f"{path}.id_out")
        if id_out in values:
            raise FormatError(f"id {id_out} is already the id of another value",
                              field=f"{path}.id_out")
        values[id_out] = v
        datatype = _datatype(v.datatype, f"{path}.datatype", allow_invalid=False)
        numel = _check_dims(v.dims, f"{path}.dims")
        if _int(v.flags, _UINT32, f"{path}.flags") & ~_IO:
            raise FormatError(f"flags {v.flags:#x} has bits other than input (0x1) and "
                              "output (0x2)", field=f"{path}.flags")
        _int(v.external_id, _UINT32, f"{path}.external_id")
        index = _int(v.constant_buffer_idx, _UINT32, f"{path}.constant_buffer_idx")
        if index:
            _check_constant_value(graph, index, datatype, numel, v.flags, path)
        _check_dq_datatype(v, path)
        if v.quant is not None:
            _check_quant(v, graph.constant_data, f"{path}.quant_params")
    return values


def _check_dq_datatype(v: G.TensorValue, path: str) -> None:
    """Run-time quantization of a value: only of an input, only to qint8."""
    dq = _datatype(v.dq_datatype, f"{path}.dq_datatype", allow_invalid=True)
    if dq is G.Datatype.INVALID:
        return
    if dq is not G.Datatype.QINT8:
        raise FormatError(f"{dq.name} is not supported; only QINT8", field=f"{path}.dq_datatype")
    if not v.flags & G.FLAG_EXTERNAL_INPUT or v.constant_buffer_idx or v.quant is not None:
        raise FormatError("only a non-constant, unquantized external input may be quantized "
                          "at run time", field=f"{path}.dq_datatype")


def _check_dims(dims: Any, path: str) -> int:
    _ints(dims, _UINT32, path)
    if len(dims) > MAX_DIMS:
        raise FormatError(f"rank {len(dims)} is above XNNPACK's limit of {MAX_DIMS}",
                          field=path)
    numel = math.prod(dims)
    if numel > MAX_ELEMENTS:
        raise FormatError(f"{numel} elements is above the limit of {MAX_ELEMENTS}", field=path)
    return numel


def _check_constant_value(graph: G.XNNGraph, index: int, datatype: G.Datatype, numel: int,
                          flags: int, path: str) -> None:
    if index >= len(graph.constant_data):
        raise FormatError(f"{index} is not an index of constant_data "
                          f"({len(graph.constant_data)} entries)",
                          field=f"{path}.constant_buffer_idx")
    if flags & _IO:
        raise FormatError("a constant cannot be an external input or output",
                          field=f"{path}.flags")
    bits = _BITS.get(datatype)
    needed = 0 if bits is None else (numel * bits + 7) // 8
    size = graph.constant_data[index].size
    if size < needed:
        raise FormatError(
            f"constant_data[{index}] holds {size} bytes, but the value needs {needed}",
            field=f"{path}.constant_buffer_idx")


def _check_quant(v: G.TensorValue, constants: list[G.ConstantDataOffset], path: str) -> None:
    quant, rank = v.quant, len(v.dims)
    if isinstance(quant, G.PerTensorQuant):
        _float(quant.scale, f"{path}.scale")
        _int(quant.zero_point, _INT32, f"{path}.zero_point")
    elif isinstance(quant, G.PerTokenDynamicQuant):
        if not 0 <= _int(quant.num_nonbatch_dims, _INT32, f"{path}.num_nonbatch_dims") <= rank:
            raise FormatError(f"{quant.num_nonbatch_dims} is not in 0..{rank}",
                              field=f"{path}.num_nonbatch_dims")
        if v.constant_buffer_idx:
            raise FormatError("a value quantized at run time cannot be a constant", field=path)
    elif isinstance(quant, (G.PerChannelQuant, G.PerChannelGroupQuant)):
        _check_scales(v, quant, constants, path)
    else:
        raise FormatError(f"{type(quant).__name__} is not a quantization kind", field=path)


def _check_scales(v: G.TensorValue, quant: G.PerChannelQuant | G.PerChannelGroupQuant,
                  constants: list[G.ConstantDataOffset], path: str) -> None:
    """XNNPACK reads one scale per channel (fp32) or per block (bf16), from the
    inline list or from a constant: there must be that many."""
    rank = len(v.dims)
    if not isinstance(quant.scale, (list, tuple)):
        raise FormatError(f"{quant.scale!r} is not a list", field=f"{path}.scale")
    for i, scale in enumerate(quant.scale):
        _float(scale, f"{path}.scale[{i}]")
    if not 0 <= _int(quant.channel_dim, _INT32, f"{path}.channel_dim") < rank:
        raise FormatError(f"channel dim {quant.channel_dim} is not below the rank {rank}",
                          field=f"{path}.channel_dim")
    index = _int(quant.scale_buffer_idx, _UINT32, f"{path}.scale_buffer_idx")
    if index >= len(constants):
        raise FormatError(f"{index} is not an index of constant_data",
                          field=f"{path}.scale_buffer_idx")
    _int(quant.num_scales, _UINT32, f"{path}.num_scales")
    if isinstance(quant, G.PerChannelQuant):
        count, scale_bytes = v.dims[quant.channel_dim], 4
    else:
        if v.datatype != G.Datatype.QBINT4 or rank != 2:
            raise FormatError("blockwise quantization needs a 2-d QBINT4 value", field=path)
        group = _int(quant.group_size, _INT32, f"{path}.group_size")
        if group <= 0 or v.dims[1] % group:
            raise FormatError(f"group size {group} does not divide the {v.dims[1]} input "
                              "channels", field=f"{path}.group_size")
        count, scale_bytes = v.dims[0] * v.dims[1] // group, 2
        if index and quant.num_scales != count:
            raise FormatError(f"{quant.num_scales} scales for {count} blocks",
                              field=f"{path}.num_scales")
    if index and constants[index].size < count * scale_bytes:
        raise FormatError(f"constant_data[{index}] holds {constants[index].size} bytes, "
                          f"not {count} scales", field=f"{path}.scale_buffer_idx")
    if not index and len(quant.scale) != count:
        raise FormatError(f"{len(quant.scale)} scales for {count} channels or blocks",
                          field=f"{path}.scale")


def _check_externals(graph: G.XNNGraph, values: dict[int, G.TensorValue]) -> None:
    owner: dict[int, int] = {}  # external id -> value id
    for i, v in enumerate(graph.values):
        path = f"{ROOT}.xvalues[{i}].external_id"
        if v.external_id == G.INVALID_VALUE_ID:
            if v.flags & _IO:
                raise FormatError("flagged as an input or output but has no external id",
                                  field=path)
            continue
        if v.external_id >= graph.num_externs:
            raise FormatError(f"external id {v.external_id} is not below num_externs "
                              f"({graph.num_externs})", field=path)
        if v.external_id in owner:
            raise FormatError(f"external id {v.external_id} is also value "
                              f"{owner[v.external_id]}'s", field=path)
        owner[v.external_id] = v.id_out
    for name, flag in (("input_ids", G.FLAG_EXTERNAL_INPUT),
                       ("output_ids", G.FLAG_EXTERNAL_OUTPUT)):
        ids = _ints(getattr(graph, name), _UINT32, f"{ROOT}.{name}")
        listed: set[int] = set()
        for i, value_id in enumerate(ids):
            found = values.get(value_id)
            if found is None or not found.flags & flag:
                what = "no value" if found is None else f"a value without flag {flag:#x}"
                raise FormatError(f"id {value_id} is {what}", field=f"{ROOT}.{name}[{i}]")
            if value_id in listed:
                raise FormatError(f"id {value_id} is listed twice", field=f"{ROOT}.{name}[{i}]")
            listed.add(value_id)
        for i, v in enumerate(graph.values):
            if v.flags & flag and v.id_out not in listed:
                raise FormatError(f"flagged {flag:#x} but value {v.id_out} is not in {name}",
                                  field=f"{ROOT}.xvalues[{i}].flags")


def _check_node(node: Any, values: dict[int, G.TensorValue], path: str) -> None:
    if not isinstance(node, G.Node):
        raise FormatError(f"{type(node).__name__} is not a Node", field=path)
    try:
        kind = G.NodeKind(node.kind)
    except ValueError:
        raise FormatError(f"unknown node kind {node.kind!r}", field=f"{path}.xnode_union_type"
                          ) from None
    params, union = node.params, f"{path}.xnode_union"
    expected = G.PARAMS_OF_KIND[kind]
    if type(params) is not expected:
        raise FormatError(f"a {kind.name} node takes {expected.__name__} parameters, "
                          f"not {type(params).__name__}", field=union)
    _int(node.debug_handle, _UINT32, f"{path}.debug_handle")
    if node.output_min_max is not None:
        if not isinstance(node.output_min_max, tuple) or len(node.output_min_max) != 2:
            raise FormatError("is not a (min, max) pair", field=f"{path}.output_min_max")
        for bound in node.output_min_max:
            _float(bound, f"{path}.output_min_max")
    for name, field_kind in PARAM_LAYOUTS[expected]:
        value, where = getattr(params, name), f"{union}.{name}"
        if field_kind == "uints":
            _ints(value, _UINT32, where)
        elif field_kind == "float":
            _float(value, where)
        else:
            _int(value, _UINT32, where)
    for name in _ids_read_or_written(kind, expected):
        value_id = getattr(params, name)
        if value_id not in values and not (
                name in _OPTIONAL_IDS and value_id == G.INVALID_VALUE_ID):
            raise FormatError(f"id {value_id} is not a value", field=f"{union}.{name}")
    _check_shapes(params, values, union)


def _ids_read_or_written(kind: G.NodeKind, params: type) -> list[str]:
    """The id fields a node of `kind` uses: all but a concatenation's unused inputs."""
    names = [name for name, _ in PARAM_LAYOUTS[params] if name.endswith("_id")]
    if kind in _CONCAT_INPUTS:
        unused = {f"input{n}_id" for n in range(_CONCAT_INPUTS[kind] + 1, 6)}
        names = [name for name in names if name not in unused]
    return names


def _rank(values: dict[int, G.TensorValue], value_id: int) -> int:
    return len(values[value_id].dims)


def _check_shapes(p: Any, values: dict[int, G.TensorValue], path: str) -> None:
    if isinstance(p, (G.StaticTranspose, G.StaticReshape, G.StaticSlice)):
        lists = [name for name, kind in PARAM_LAYOUTS[type(p)] if kind == "uints"]
        for name in lists:
            if len(getattr(p, name)) != p.num_dims:
                raise FormatError(f"has {len(getattr(p, name))} entries for num_dims "
                                  f"{p.num_dims}", field=f"{path}.{name}")
        if p.num_dims > MAX_DIMS:
            raise FormatError(f"rank {p.num_dims} is above XNNPACK's limit of {MAX_DIMS}",
                              field=f"{path}.num_dims")
        if not isinstance(p, G.StaticReshape) and p.num_dims != _rank(values, p.input_id):
            raise FormatError(f"num_dims {p.num_dims} is not the input's rank "
                              f"{_rank(values, p.input_id)}", field=f"{path}.num_dims")
        if isinstance(p, G.StaticTranspose) and sorted(p.perm) != list(range(p.num_dims)):
            raise FormatError(f"{p.perm} is not a permutation", field=f"{path}.perm")
    elif isinstance(p, G.StaticConstantPad):
        rank = _rank(values, p.input_id)
        for name in ("pre_paddings", "post_paddings"):
            if len(getattr(p, name)) != rank:
                raise FormatError(f"has {len(getattr(p, name))} entries for the input's rank "
                                  f"{rank}", field=f"{path}.{name}")
    elif isinstance(p, G.Concatenate):
        if p.axis >= _rank(values, p.output_id):
            raise FormatError(f"axis {p.axis} is not below the output's rank "
                              f"{_rank(values, p.output_id)}", field=f"{path}.axis")
    elif isinstance(p, G.Conv) and p.groups == 0:
        raise FormatError("groups is 0", field=f"{path}.groups")
