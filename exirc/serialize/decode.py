"""Checked FlatBuffer tables -> program model.

One function per schema table. Slot numbers are the field positions in
`schema/program.fbs` (the round-trip tests and the ExecuTorch-file tests
catch any drift). Values that the schema types loosely are checked here
against what they may mean: enums are in range, sizes are non-negative and
dim orders are permutations. Cross-references between tables (an operator
index, a value index) are checked afterwards by `validate.py`, which sees
the whole program.

A table several fields point at (exirc shares the source frames of one line;
a hostile file may point a million values at one table) is decoded at most
twice and then shared (`CheckedBuffer.once`): memory follows the file's
bytes, not its references. Code that walks values must therefore treat a
shared long list once, not once per value (validation and the runtime's
value table do). Short scalar vectors that recur (tensor sizes and dim
orders, call arguments) are likewise one object for all (`CheckedBuffer.pooled`):
code that edits a decoded program in place must copy such a list first. A
call's arguments are `P.Args`, int32s in one block, not a list of ints: a
file of many calls would otherwise cost several times its size.
"""

from __future__ import annotations

import enum
from typing import TypeVar

from exirc.errors import FormatError
from exirc.serialize import program as P
from exirc.serialize.checked_buffer import (
    BOOL,
    F64,
    I8,
    I32,
    I64,
    U32,
    U64,
    CheckedBuffer,
    TableView,
)

E = TypeVar("E", bound=enum.IntEnum)

# Dims a tensor may have: far beyond any model (ExecuTorch's runtime allows
# 16), and few enough that shape arithmetic and listings stay small.
MAX_DIMS = 64


def _enum(kind: type[E], raw: int, t: TableView, name: str) -> E:
    member: E | None = kind._value2member_map_.get(raw)  # type: ignore[assignment]
    if member is not None:  # as kind(raw), without its machinery: a million tensors
        return member
    try:
        return kind(raw)
    except ValueError:
        raise FormatError(f"{raw} is not a valid {kind.__name__}",
                          field=f"{t.path}.{name}") from None


def decode_program(buf: CheckedBuffer) -> P.Program:
    t = buf.root()
    constant_segment = t.table(5, "constant_segment")
    return P.Program(
        version=t.scalar(0, U32, 0, "version"),
        execution_plan=[execution_plan(x) for x in t.tables(1, "execution_plan")],
        constant_buffer=[P.Buffer(x.byte_vector(0, "storage"))
                         for x in t.tables(2, "constant_buffer")],
        backend_delegate_data=[P.BackendDelegateInlineData(x.byte_vector(0, "data"))
                               for x in t.tables(3, "backend_delegate_data")],
        # Segment bytes are attached by the caller, which knows the file layout.
        segments=[],
        constant_segment=None if constant_segment is None
        else subsegment_offsets(constant_segment),
        mutable_data_segments=[subsegment_offsets(x)
                               for x in t.tables(6, "mutable_data_segments")],
        named_data=[P.NamedData(x.string(0, "key") or "", x.scalar(1, U32, 0, "segment_index"))
                    for x in t.tables(7, "named_data")],
    )


def segment_ranges(buf: CheckedBuffer) -> list[tuple[int, int]]:
    """(offset, size) of each DataSegment, relative to the segment base."""
    return [(x.scalar(0, U64, 0, "offset"), x.scalar(1, U64, 0, "size"))
            for x in buf.root().tables(4, "segments")]


def subsegment_offsets(t: TableView) -> P.SubsegmentOffsets:
    return P.SubsegmentOffsets(t.scalar(0, U32, 0, "segment_index"),
                               t.scalars(1, "Q", "offsets"))


def execution_plan(t: TableView) -> P.ExecutionPlan:
    meta = t.table(1, "container_meta_type")
    sizes = t.scalars(8, "q", "non_const_buffer_sizes")
    for i, size in enumerate(sizes):
        if size < 0:
            raise FormatError(f"buffer size {size} is negative",
                              field=f"{t.path}.non_const_buffer_sizes[{i}]")
    return P.ExecutionPlan(
        name=t.string(0, "name") or "",
        container_meta_type=None if meta is None else P.ContainerMetadata(
            meta.string(0, "encoded_inp_str") or "", meta.string(1, "encoded_out_str") or ""),
        values=[t.buf.once(x, evalue) for x in t.tables(2, "values")],
        inputs=t.scalars(3, "i", "inputs"),
        outputs=t.scalars(4, "i", "outputs"),
        chains=[chain(x) for x in t.tables(5, "chains")],
        operators=[P.Operator(x.string(0, "name") or "", x.string(1, "overload") or "")
                   for x in t.tables(6, "operators")],
        delegates=[delegate(x) for x in t.tables(7, "delegates")],
        non_const_buffer_sizes=sizes,
        non_const_buffer_device=[
            P.NonConstBufferDevice(
                x.scalar(0, I32, 0, "buffer_idx"),
                _enum(P.DeviceType, x.scalar(1, I8, 0, "device_type"), x, "device_type"),
                x.scalar(2, I8, 0, "device_index"))
            for x in t.tables(9, "non_const_buffer_device")
        ],
    )


def delegate(t: TableView) -> P.BackendDelegate:
    processed = t.table(1, "processed")
    if processed is None:
        raise FormatError("delegate has no processed data reference", field=f"{t.path}.processed")
    return P.BackendDelegate(
        id=t.string(0, "id") or "",
        processed=P.BackendDelegateDataReference(
            _enum(P.DataLocation, processed.scalar(0, I8, 0, "location"), processed, "location"),
            processed.scalar(1, U32, 0, "index")),
        compile_specs=[P.CompileSpec(x.string(0, "key") or "", x.byte_vector(1, "value"))
                       for x in t.tables(2, "compile_specs")],
    )


def chain(t: TableView) -> P.Chain:
    once = t.buf.once
    return P.Chain(
        inputs=t.scalars(0, "i", "inputs"),
        outputs=t.scalars(1, "i", "outputs"),
        instructions=[once(x, instruction) for x in t.tables(2, "instructions")],
        # exirc's writer stores the frames of one source line once for all
        # its instructions: decoded once, shared likewise.
        stacktrace=[once(x, frame_list) for x in t.tables(3, "stacktrace")],
    )


def frame_list(t: TableView) -> P.FrameList:
    return P.FrameList([t.buf.once(f, frame) for f in t.tables(0, "items")])


def frame(t: TableView) -> P.Frame:
    return P.Frame(t.string(0, "filename"), t.scalar(1, I32, 0, "lineno"),
                   t.string(2, "name"), t.string(3, "context"))


def instruction(t: TableView) -> P.Instruction:
    kind, body = t.union(0, 1, "instr_args", P.INSTRUCTION_TYPES)
    if kind is P.KernelCall:
        return P.KernelCall(body.scalar(0, I32, 0, "op_index"), body.int32s(1, "args"))
    if kind is P.DelegateCall:
        return P.DelegateCall(body.scalar(0, I32, 0, "delegate_index"),
                              body.scalars(1, "i", "args"))
    if kind is P.MoveCall:
        return P.MoveCall(body.scalar(0, I32, 0, "move_from"), body.scalar(1, I32, 0, "move_to"))
    if kind is P.JumpFalseCall:
        return P.JumpFalseCall(body.scalar(0, I32, 0, "cond_value_index"),
                               body.scalar(1, I32, 0, "destination_instruction"))
    return P.FreeCall(body.scalar(0, I32, 0, "value_index"))


def evalue(t: TableView) -> P.EValue:
    kind, body = t.union(0, 1, "val", P.KERNEL_TYPES)
    if kind is P.Tensor:
        return tensor(body)
    if kind is P.Null:
        return P.Null()
    if kind is P.Int:
        return P.Int(body.scalar(0, I64, 0, "int_val"))
    if kind is P.Bool:
        return P.Bool(bool(body.scalar(0, BOOL, 0, "bool_val")))
    if kind is P.Double:
        return P.Double(float(body.scalar(0, F64, 0.0, "double_val")))
    if kind is P.String:
        return P.String(body.string(0, "string_val") or "")
    if kind is P.IntList:
        return P.IntList(body.scalars(0, "q", "items"))
    if kind is P.DoubleList:
        return P.DoubleList(body.floats(0, "items"))
    if kind is P.BoolList:
        return P.BoolList([bool(x) for x in body.scalars(0, "B", "items")])
    if kind is P.TensorList:
        return P.TensorList(body.scalars(0, "i", "items"))
    return P.OptionalTensorList(body.scalars(0, "i", "items"))


def tensor(t: TableView) -> P.Tensor:
    sizes = t.pooled_scalars(2, "i", "sizes")
    if len(sizes) > MAX_DIMS:
        raise FormatError(f"{len(sizes)} dims, more than the {MAX_DIMS} a tensor may have",
                          field=f"{t.path}.sizes")
    for i, size in enumerate(sizes):
        if size < 0:
            raise FormatError(f"size {size} is negative", field=f"{t.path}.sizes[{i}]")
    dim_order = t.pooled_scalars(3, "B", "dim_order")
    # An empty dim order means contiguous; otherwise it must be a permutation.
    if dim_order and sorted(dim_order) != list(range(len(sizes))):
        raise FormatError(f"{dim_order} is not a permutation of the {len(sizes)} dimensions",
                          field=f"{t.path}.dim_order")
    allocation = t.table(6, "allocation_info")
    extra = t.table(9, "extra_tensor_info")
    return P.Tensor(
        scalar_type=_enum(P.ScalarType, t.scalar(0, I8, 0, "scalar_type"), t, "scalar_type"),
        storage_offset=t.scalar(1, I32, 0, "storage_offset"),
        sizes=sizes,
        dim_order=dim_order,
        requires_grad=bool(t.scalar(4, BOOL, 0, "requires_grad")),
        data_buffer_idx=t.scalar(5, U32, 0, "data_buffer_idx"),
        allocation_info=None if allocation is None else P.AllocationDetails(
            allocation.scalar(0, U32, 0, "memory_id"),
            allocation.scalar(1, U32, 0, "memory_offset_low"),
            allocation.scalar(2, U32, 0, "memory_offset_high")),
        layout=t.scalar(7, I8, 0, "layout"),
        shape_dynamism=_enum(P.TensorShapeDynamism, t.scalar(8, I8, 0, "shape_dynamism"), t,
                             "shape_dynamism"),
        extra_tensor_info=None if extra is None else extra_tensor_info(extra),
    )


def extra_tensor_info(t: TableView) -> P.ExtraTensorInfo:
    return P.ExtraTensorInfo(
        mutable_data_segments_idx=t.scalar(0, U64, 0, "mutable_data_segments_idx"),
        fully_qualified_name=t.string(1, "fully_qualified_name"),
        location=_enum(P.TensorDataLocation, t.scalar(2, I8, 0, "location"), t, "location"),
        device_type=_enum(P.DeviceType, t.scalar(3, I8, 0, "device_type"), t, "device_type"),
        device_index=t.scalar(4, I8, 0, "device_index"),
    )



