"""Planned memory: arenas, and tensors that are views of arena or file bytes.

A program's memory plan gives every non-constant tensor a buffer
(`memory_id`) and a byte offset in it. Loading allocates one arena per buffer,
of exactly the planned size, and makes each planned tensor a torch tensor over
its own bytes of that arena. Kernels therefore write where the plan says, and
tensors the plan puts on the same bytes (views the compiler elided, an input
whose memory is later reused) share them here too. Constant tensors are views
of the mapped file: loading copies no weights.

Each tensor gets its own storage covering exactly its planned bytes, and
that storage cannot grow. A kernel asked to write more than the plan allows
(a dynamic shape beyond its bound, or a wrong plan) then fails with torch's
"not resizable" error instead of overwriting a neighbour or allocating.
"""

from __future__ import annotations

import array
import functools
from collections.abc import Sequence
from typing import Any

import numpy
import torch

from exirc.errors import FormatError, ResourceError, UnsupportedOperatorError
from exirc.runtime.tensor_layout import strides
from exirc.serialize import program as P

TORCH_DTYPES: dict[P.ScalarType, torch.dtype] = {
    P.ScalarType.BYTE: torch.uint8,
    P.ScalarType.CHAR: torch.int8,
    P.ScalarType.SHORT: torch.int16,
    P.ScalarType.INT: torch.int32,
    P.ScalarType.LONG: torch.int64,
    P.ScalarType.HALF: torch.float16,
    P.ScalarType.FLOAT: torch.float32,
    P.ScalarType.DOUBLE: torch.float64,
    P.ScalarType.BOOL: torch.bool,
    P.ScalarType.BFLOAT16: torch.bfloat16,
    P.ScalarType.BITS16: torch.bits16,
    P.ScalarType.FLOAT8E5M2: torch.float8_e5m2,
    P.ScalarType.FLOAT8E4M3FN: torch.float8_e4m3fn,
    P.ScalarType.FLOAT8E5M2FNUZ: torch.float8_e5m2fnuz,
    P.ScalarType.FLOAT8E4M3FNUZ: torch.float8_e4m3fnuz,
    P.ScalarType.UINT16: torch.uint16,
    P.ScalarType.UINT32: torch.uint32,
    P.ScalarType.UINT64: torch.uint64,
}
"""Element types the interpreter runs. The quantized ones (qint8, quint4x2, ...)
have no plain-bytes view in torch; programs use int8 tensors plus scales instead."""

SCALAR_TYPES: dict[torch.dtype, P.ScalarType] = {v: k for k, v in TORCH_DTYPES.items()}

# Arenas start on a cache line, like torch's own allocations; planners align
# offsets within them (ExecuTorch: 16 bytes).
_ALIGNMENT = 64

FIRST_SHARED_BUFFER = P.FIRST_SHARED_BUFFER

Arena = numpy.typing.NDArray[numpy.uint8]


def torch_dtype(scalar_type: P.ScalarType, where: str) -> torch.dtype:
    dtype = TORCH_DTYPES.get(scalar_type)
    if dtype is None:
        raise UnsupportedOperatorError(
            f"{where} has element type {scalar_type.short_name}, which the interpreter "
            "cannot run", hint="quantized element types are not supported; use int8 tensors")
    return dtype


@functools.cache
def numpy_dtype(dtype: torch.dtype) -> numpy.dtype[Any] | None:
    """numpy's equal of `dtype`; None for those numpy lacks (bfloat16, float8, bits16).
    Asked of an empty tensor: `numpy()` makes a storage unresizable for good."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):
        return None


def check_arena_sizes(plans: list[P.ExecutionPlan], limit: int, why: str) -> None:
    """Refuse a memory plan beyond `limit` bytes before allocating any of it.

    A hostile file can declare terabytes of planned memory in a few bytes; we
    say so instead of letting the allocation fail (or succeed, and swap).
    Every buffer counts, entry 0 included (it is allocated like the others),
    and a buffer the methods share counts once, at its largest.
    """
    total = planned_bytes(plans)
    if total <= limit:
        return
    largest = max(plans, key=lambda plan: sum(plan.non_const_buffer_sizes))
    raise ResourceError(
        f"the memory plan needs {_size(total)} of arenas, more than the {_size(limit)} "
        f"allowed ({why}); method {largest.name!r} alone needs "
        f"{_size(sum(largest.non_const_buffer_sizes))}",
        hint="if the program is trusted and the memory exists, raise the limit "
             "(`exirc run --max-memory`, or `load(..., max_memory=...)`)")


def planned_bytes(plans: list[P.ExecutionPlan]) -> int:
    """Bytes of arenas loading `plans` allocates: each method's own buffers,
    and each shared buffer once, as large as the largest any method declares."""
    own = sum(sum(plan.non_const_buffer_sizes[:FIRST_SHARED_BUFFER]) for plan in plans)
    return own + sum(shared_sizes(plans))


def shared_sizes(plans: list[P.ExecutionPlan]) -> array.array[int]:
    """Size of each shared buffer, from `FIRST_SHARED_BUFFER` on: the largest any
    method declares (a method declaring fewer buffers does not use the rest)."""
    sizes: array.array[int] = array.array("q")
    for plan in plans:
        declared = plan.non_const_buffer_sizes
        for i in range(FIRST_SHARED_BUFFER, len(declared)):
            k = i - FIRST_SHARED_BUFFER
            if k == len(sizes):
                sizes.append(declared[i])
            elif declared[i] > sizes[k]:
                sizes[k] = declared[i]
    return sizes


class _Block:
    """Arenas as views of one zeroed allocation, each starting on a cache line.

    One allocation instead of one per buffer: a file declaring a hundred
    thousand tiny buffers costs their bytes, not a hundred thousand arrays.
    Views are made when asked for (only buffers that tensors use are).
    """

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = array.array("q", sizes)
        self.starts = array.array("q")
        end = 0
        for size in self.sizes:
            self.starts.append(end)
            end += -(-size // _ALIGNMENT) * _ALIGNMENT
        self.memory = _zeroed(end)

    def view(self, k: int) -> Arena:
        start = self.starts[k]
        return self.memory[start:start + self.sizes[k]]


class SharedArenas(dict[int, Arena]):
    """The buffers methods share (id `FIRST_SHARED_BUFFER` on), each as big as
    the largest any method declares. A dict only for lookups (`shared[i]`):
    each view is made when asked for, and not kept."""

    def __init__(self, sizes: Sequence[int]) -> None:
        super().__init__()
        self._block = _Block(sizes)

    def __missing__(self, memory_id: int) -> Arena:
        k = memory_id - FIRST_SHARED_BUFFER
        if not 0 <= k < len(self._block.sizes):
            raise KeyError(memory_id)
        return self._block.view(k)


def allocate_shared_arenas(plans: list[P.ExecutionPlan]) -> SharedArenas:
    """The buffers methods share, each as big as the largest any method declares."""
    return SharedArenas(shared_sizes(plans))


class Arenas:
    """One method's arenas by buffer id: its own (ids below `FIRST_SHARED_BUFFER`)
    and views of the shared ones, exactly the size it declares."""

    def __init__(self, plan: P.ExecutionPlan, shared: dict[int, Arena] | None) -> None:
        sizes = plan.non_const_buffer_sizes
        self._count = len(sizes)
        self._own = _Block(sizes[:FIRST_SHARED_BUFFER])
        self._sizes = array.array("q", sizes[FIRST_SHARED_BUFFER:])
        self._shared = shared if shared is not None \
            else allocate_shared_arenas([plan])

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, memory_id: int) -> Arena:
        if not 0 <= memory_id < self._count:
            raise IndexError(f"no buffer {memory_id} ({self._count} planned)")
        if memory_id < FIRST_SHARED_BUFFER:
            return self._own.view(memory_id)
        return self._shared[memory_id][:self._sizes[memory_id - FIRST_SHARED_BUFFER]]


def allocate_arenas(plan: P.ExecutionPlan, shared: dict[int, Arena] | None = None) -> Arenas:
    """One arena per planned buffer, exactly its size, entry 0 included.

    Buffers in `shared` (program state) are views of those arrays, so every
    method reads and writes the same memory. Zeroed, as ExecuTorch's planned
    memory is, so a program that reads a buffer before writing it (mutable
    state without an initial value) sees zeros, not garbage; and lazily,
    since calloc maps zero pages that are only touched when used.
    """
    return Arenas(plan, shared)


_NOTHING: Arena = numpy.zeros(0, dtype=numpy.uint8)


def _zeroed(size: int) -> Arena:
    """`size` zero bytes starting on a cache line; ResourceError if the system
    refuses them (the plan was checked against the memory available, but that
    can change, and an allocator may refuse what /proc/meminfo offers)."""
    if size == 0:
        return _NOTHING
    try:
        raw = numpy.zeros(size + _ALIGNMENT, dtype=numpy.uint8)
    except (MemoryError, ValueError):
        raise ResourceError(
            f"cannot allocate {_size(size)} of planned memory (arenas): the system "
            "refused it", hint="free memory, or run the program on a machine with more"
        ) from None
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start:start + size]


def planned_tensor(arena: numpy.typing.NDArray[numpy.uint8], meta: P.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
    """The tensor at its planned offset, with capacity for exactly its planned bytes."""
    assert meta.allocation_info is not None
    start = meta.allocation_info.offset
    return _view(torch.from_numpy(arena[start:start + meta.nbytes]), meta, dtype)


def initial_state(program: P.Program, meta: P.Tensor, where: str) -> memoryview:
    """The initial bytes of a planned tensor that is mutable state (a buffer the
    program updates in place across runs), from `mutable_data_segments`.

    Such a tensor has both `allocation_info` and a `data_buffer_idx`, which
    then indexes the mutable segment's offsets, not the constants.
    """
    extra = meta.extra_tensor_info
    which = extra.mutable_data_segments_idx if extra is not None else 0
    if not 0 <= which < len(program.mutable_data_segments):
        raise FormatError(f"mutable data segment {which} does not exist "
                          f"({len(program.mutable_data_segments)} in the program)", field=where)
    sub = program.mutable_data_segments[which]
    if not 0 <= meta.data_buffer_idx < len(sub.offsets):
        raise FormatError(f"data_buffer_idx {meta.data_buffer_idx} is out of range: mutable data "
                          f"segment {which} has {len(sub.offsets)} entries", field=where)
    data = memoryview(program.segments[sub.segment_index].data)
    start = sub.offsets[meta.data_buffer_idx]
    if start + meta.nbytes > len(data):
        raise FormatError(f"initial state of {meta.nbytes} bytes at offset {start} runs past "
                          f"its {len(data)}-byte segment", field=where)
    return data[start:start + meta.nbytes]


def constant_tensor(data: bytes | memoryview, meta: P.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A constant as a view of the program's bytes (the mapped file): no copy.

    Bytes that torch may not alias (a read-only buffer, which a kernel writing
    into a constant would corrupt or fault on) are copied once instead.
    """
    nbytes = meta.nbytes
    if nbytes == 0:
        return _view(torch.empty(0, dtype=torch.uint8), meta, dtype)
    buffer: bytes | bytearray | memoryview = data
    if isinstance(data, bytes) or data.readonly:
        buffer = bytearray(data[:nbytes])
    return _view(torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes), meta, dtype)


def placeholder(dtype: torch.dtype) -> torch.Tensor:
    """A tensor with no memory of its own: one an instruction points elsewhere
    (a run-time view, an unplanned input). Writing into it fails, never allocates."""
    return torch.from_numpy(numpy.zeros(16, dtype=numpy.uint8)).view(dtype)[:0]


def alias(target: torch.Tensor, source: torch.Tensor) -> None:
    """Make `target` (the same tensor object, which instructions hold) share
    `source`'s memory, sizes and strides."""
    target.set_(source.untyped_storage(), source.storage_offset(), source.size(),
                source.stride())


def _view(raw: torch.Tensor, meta: P.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`raw` (uint8, exactly the tensor's bytes) as `meta`'s dtype, sizes and layout."""
    if raw.numel() == 0:
        # No bytes to reinterpret: an empty tensor of the declared shape.
        return placeholder(dtype).as_strided(meta.sizes, strides(meta.sizes, meta.dim_order))
    return raw.view(dtype).as_strided(meta.sizes, strides(meta.sizes, meta.dim_order))


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"
