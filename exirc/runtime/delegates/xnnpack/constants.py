"""Datatypes and constant data: what each XNNPACK value is as a torch tensor.

Weights are resolved once, at init. A constant's bytes live either in the
blob's own constant region (`ConstantDataOffset.offset`) or in the program's
named data (`named_key`; ExecuTorch stores XNNPACK weights there, keyed by
their sha256, so that a weight shared by two delegates is stored once). We
check that the bytes found are exactly what the value's dims and datatype
need (at least), then view them as a tensor without copying when we may (a writable,
suitably aligned buffer: a program loaded from a file is mapped
copy-on-write) and copy them once otherwise. Nothing is copied per call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from exirc.errors import FormatError
from exirc.serialize.xnnpack import graph as G

FLOAT_TYPES: dict[G.Datatype, torch.dtype] = {
    G.Datatype.FP32: torch.float32,
    G.Datatype.FP16: torch.float16,
    G.Datatype.BF16: torch.bfloat16,
}
"""The float datatypes, which the float kernels compute in directly."""

# The element type each datatype is stored as. 4-bit types pack two elements a
# byte; `storage_bytes` accounts for that.
STORAGE_TYPES: dict[G.Datatype, torch.dtype] = {
    **FLOAT_TYPES,
    G.Datatype.INT32: torch.int32,
    G.Datatype.QINT8: torch.int8,
    G.Datatype.QUINT8: torch.uint8,
    G.Datatype.QINT32: torch.int32,
    G.Datatype.QCINT8: torch.int8,
    G.Datatype.QCINT32: torch.int32,
    G.Datatype.QDINT8: torch.int8,
    G.Datatype.QCINT4: torch.uint8,
    G.Datatype.QBINT4: torch.uint8,
}
PACKED_4BIT = frozenset({G.Datatype.QCINT4, G.Datatype.QBINT4})


def storage_dtype(value: G.TensorValue, where: str) -> torch.dtype:
    dtype = STORAGE_TYPES.get(value.datatype)
    if dtype is None:
        raise FormatError(f"value {value.id_out} has datatype {_name(value.datatype)}, which "
                          "no XNNPACK tensor is stored as", field=where)
    return dtype


def storage_bytes(value: G.TensorValue, where: str) -> int:
    """The bytes a constant of this value's dims and datatype takes."""
    dtype = storage_dtype(value, where)
    if value.datatype in PACKED_4BIT:
        # Two 4-bit elements a byte along the innermost dim, rows padded to a byte.
        inner = value.dims[-1] if value.dims else 1
        rows = math.prod(value.dims[:-1])
        return rows * ((inner + 1) // 2)
    return math.prod(value.dims) * dtype.itemsize


def _name(datatype: G.Datatype | int) -> str:
    try:
        return G.Datatype(datatype).name.lower()
    except ValueError:
        return f"#{int(datatype)}"


def datatype_name(datatype: G.Datatype | int) -> str:
    """`fp32`, `qint8`: how messages name a datatype."""
    return _name(datatype)


NamedData = Callable[[str], "bytes | memoryview | None"]


@dataclass(frozen=True)
class ConstantSource:
    """Where constants come from: the blob's constant region and the program's named data."""

    graph: G.XNNGraph
    region: bytes | memoryview
    named: NamedData | None
    where: str

    def raw(self, buffer_idx: int, nbytes: int, what: str) -> memoryview:
        """The `nbytes` bytes of `constant_data[buffer_idx]`, checked."""
        entries = self.graph.constant_data
        field = f"{self.where}.constant_data[{buffer_idx}]"
        if not 0 < buffer_idx < len(entries):
            raise FormatError(f"{what} refers to constant {buffer_idx}, but the blob has "
                              f"{max(len(entries) - 1, 0)} (1 to {len(entries) - 1})",
                              field=self.where)
        entry = entries[buffer_idx]
        if entry.size < nbytes:  # more is fine: ExecuTorch records a tensor's whole storage
            raise FormatError(f"{what} needs {nbytes} bytes, but its constant holds only "
                              f"{entry.size}", field=field)
        if entry.is_named:
            if self.named is None:
                raise FormatError(f"{what} is stored as named data {entry.named_key!r}, which "
                                  "only a program can provide", field=field)
            data = self.named(entry.named_key)
            if data is None:
                raise FormatError(f"{what} is stored as named data {entry.named_key!r}, which "
                                  "the program does not have", field=field)
            view = memoryview(data).cast("B")
            if len(view) < nbytes:
                raise FormatError(f"named data {entry.named_key!r} has {len(view)} bytes, "
                                  f"{what} needs {nbytes}", field=field)
            return view[:nbytes]
        region = memoryview(self.region).cast("B")
        if entry.offset < 0 or entry.offset + nbytes > len(region):
            raise FormatError(f"{what}: bytes {entry.offset} to {entry.offset + nbytes} run "
                              f"past the {len(region)}-byte constant region", field=field)
        return region[entry.offset:entry.offset + nbytes]

    def tensor(self, value: G.TensorValue) -> torch.Tensor:
        """The constant behind `value` as a tensor of its dims (packed 4-bit types as
        bytes, [rows, ceil(inner / 2)])."""
        where = f"{self.where}.values[id {value.id_out}]"
        nbytes = storage_bytes(value, where)
        raw = self.raw(value.constant_buffer_idx, nbytes, f"constant value {value.id_out}")
        dtype = storage_dtype(value, where)
        if value.datatype in PACKED_4BIT:
            inner = value.dims[-1] if value.dims else 1
            shape = [math.prod(value.dims[:-1]), (inner + 1) // 2]
            return as_tensor(raw, torch.uint8).reshape(shape)
        return as_tensor(raw, dtype).reshape(value.dims)

    def floats(self, buffer_idx: int, count: int, dtype: torch.dtype, what: str) -> torch.Tensor:
        """`count` numbers of `dtype` from a constant (e.g. per-channel scales), as float32."""
        raw = self.raw(buffer_idx, count * dtype.itemsize, what)
        return as_tensor(raw, dtype).to(torch.float32)


def as_tensor(raw: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """`raw` as a 1-D tensor of `dtype`: a view when the memory is writable and
    aligned for `dtype`, else one copy."""
    if len(raw) == 0:
        return torch.empty(0, dtype=dtype)
    if raw.readonly:
        # torch would alias read-only memory with a warning; a stray write
        # through such a tensor would fault. One copy instead.
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
    flat = torch.frombuffer(raw, dtype=torch.uint8)
    if flat.data_ptr() % dtype.itemsize:
        flat = flat.clone()  # a fresh allocation is aligned
    return flat.view(dtype)
