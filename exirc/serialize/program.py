"""The program model: what a `.pte` file holds, as plain dataclasses.

This is the one object the emitter produces and the serializer, the
interpreter and the inspector consume. Each class names the table of
`schema/program.fbs` it stands for, and field names follow the schema, so
the schema is the reference for what a field means.

Two deliberate differences from the wire form:
  * An absent vector and an empty one mean the same and both read as `[]`.
  * A `DataSegment` carries its bytes; the offset and size the schema stores
    are layout, computed when the file is written.

Importing this module must stay cheap: no torch, no numpy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Version of the program schema we write (Program.version).
SCHEMA_VERSION = 0


class ScalarType(enum.IntEnum):
    """Element types; schema: enum ScalarType (scalar_type.fbs)."""

    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    BOOL = 11
    QINT8 = 12
    QUINT8 = 13
    QINT32 = 14
    BFLOAT16 = 15
    QUINT4X2 = 16
    QUINT2X4 = 17
    BITS16 = 22
    FLOAT8E5M2 = 23
    FLOAT8E4M3FN = 24
    FLOAT8E5M2FNUZ = 25
    FLOAT8E4M3FNUZ = 26
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def short_name(self) -> str:
        """The compact spelling used in listings, e.g. `f32`."""
        return _SHORT_NAME[self]


_ITEMSIZE = {
    ScalarType.BYTE: 1, ScalarType.CHAR: 1, ScalarType.SHORT: 2, ScalarType.INT: 4,
    ScalarType.LONG: 8, ScalarType.HALF: 2, ScalarType.FLOAT: 4, ScalarType.DOUBLE: 8,
    ScalarType.BOOL: 1, ScalarType.QINT8: 1, ScalarType.QUINT8: 1, ScalarType.QINT32: 4,
    ScalarType.BFLOAT16: 2, ScalarType.QUINT4X2: 1, ScalarType.QUINT2X4: 1,
    ScalarType.BITS16: 2, ScalarType.FLOAT8E5M2: 1, ScalarType.FLOAT8E4M3FN: 1,
    ScalarType.FLOAT8E5M2FNUZ: 1, ScalarType.FLOAT8E4M3FNUZ: 1, ScalarType.UINT16: 2,
    ScalarType.UINT32: 4, ScalarType.UINT64: 8,
}

_SHORT_NAME = {
    ScalarType.BYTE: "u8", ScalarType.CHAR: "i8", ScalarType.SHORT: "i16", ScalarType.INT: "i32",
    ScalarType.LONG: "i64", ScalarType.HALF: "f16", ScalarType.FLOAT: "f32",
    ScalarType.DOUBLE: "f64", ScalarType.BOOL: "bool", ScalarType.QINT8: "qi8",
    ScalarType.QUINT8: "qu8", ScalarType.QINT32: "qi32", ScalarType.BFLOAT16: "bf16",
    ScalarType.QUINT4X2: "qu4x2", ScalarType.QUINT2X4: "qu2x4", ScalarType.BITS16: "bits16",
    ScalarType.FLOAT8E5M2: "f8e5m2", ScalarType.FLOAT8E4M3FN: "f8e4m3fn",
    ScalarType.FLOAT8E5M2FNUZ: "f8e5m2fnuz", ScalarType.FLOAT8E4M3FNUZ: "f8e4m3fnuz",
    ScalarType.UINT16: "u16", ScalarType.UINT32: "u32", ScalarType.UINT64: "u64",
}


class TensorShapeDynamism(enum.IntEnum):
    """Schema: enum TensorShapeDynamism."""

    STATIC = 0
    DYNAMIC_BOUND = 1
    DYNAMIC_UNBOUND = 2


class TensorDataLocation(enum.IntEnum):
    """Schema: enum TensorDataLocation."""

    SEGMENT = 0
    EXTERNAL = 1


class DeviceType(enum.IntEnum):
    """Schema: enum DeviceType."""

    CPU = 0
    CUDA = 1


class DataLocation(enum.IntEnum):
    """Schema: enum DataLocation (where a delegate's payload is)."""

    INLINE = 0
    SEGMENT = 1


# --------------------------------------------------------------------------
# Values (schema: union KernelTypes, wrapped in table EValue).
# --------------------------------------------------------------------------


@dataclass
class AllocationDetails:
    """Schema: table AllocationDetails. Where a planned tensor lives."""

    memory_id: int
    memory_offset_low: int
    memory_offset_high: int = 0

    @property
    def offset(self) -> int:
        return (self.memory_offset_high << 32) | self.memory_offset_low

    @classmethod
    def at(cls, memory_id: int, offset: int) -> AllocationDetails:
        return cls(memory_id, offset & 0xFFFFFFFF, offset >> 32)


# Planned buffers from this id on are shared by every method of a program:
# ExecuTorch's convention for program state (`share_mutable_buffers` plans it
# in buffer 2 at the same offsets in every method). Buffer 1 is each method's own.
FIRST_SHARED_BUFFER = 2


@dataclass
class ExtraTensorInfo:
    """Schema: table ExtraTensorInfo."""

    mutable_data_segments_idx: int = 0
    fully_qualified_name: str | None = None
    location: TensorDataLocation = TensorDataLocation.SEGMENT
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


@dataclass
class Tensor:
    """Schema: table Tensor.

    A tensor value is one of: a constant (`data_buffer_idx` > 0), a planned
    tensor (`allocation_info` set), or memory supplied at run time (a method
    input with neither).
    """

    scalar_type: ScalarType
    sizes: list[int]
    dim_order: list[int]
    storage_offset: int = 0
    requires_grad: bool = False
    data_buffer_idx: int = 0
    allocation_info: AllocationDetails | None = None
    layout: int = 0
    shape_dynamism: TensorShapeDynamism = TensorShapeDynamism.STATIC
    extra_tensor_info: ExtraTensorInfo | None = None

    @property
    def numel(self) -> int:
        count = 1
        for size in self.sizes:
            count *= size
        return count

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor at its (upper-bound) sizes."""
        return self.numel * self.scalar_type.itemsize


@dataclass
class Null:
    """Schema: table Null (None, e.g. an absent optional argument)."""


@dataclass
class Int:
    """Schema: table Int."""

    int_val: int


@dataclass
class Bool:
    """Schema: table Bool."""

    bool_val: bool


@dataclass
class Double:
    """Schema: table Double."""

    double_val: float


@dataclass
class String:
    """Schema: table String."""

    string_val: str


@dataclass
class IntList:
    """Schema: table IntList. Holds value indices of `Int` values, not ints.

    Boxing each int lets a list mix constants with sizes computed at run time
    (SymInts), e.g. the shape argument of a `view_copy` under dynamic shapes.
    """

    items: list[int]


@dataclass
class DoubleList:
    """Schema: table DoubleList."""

    items: list[float]


@dataclass
class BoolList:
    """Schema: table BoolList."""

    items: list[bool]


@dataclass
class TensorList:
    """Schema: table TensorList. Holds value indices of tensors."""

    items: list[int]


@dataclass
class OptionalTensorList:
    """Schema: table OptionalTensorList. Value indices of tensors or nulls."""

    items: list[int]


EValue = (
    Null | Int | Bool | Double | Tensor | String | IntList | DoubleList | BoolList | TensorList
    | OptionalTensorList
)
"""Schema: table EValue; the member's class is the union's type tag."""

# Union tags of KernelTypes, in schema order (0 is NONE).
KERNEL_TYPES: tuple[type, ...] = (
    Null, Int, Bool, Double, Tensor, String, IntList, DoubleList, BoolList, TensorList,
    OptionalTensorList,
)


# --------------------------------------------------------------------------
# Instructions (schema: union InstructionArguments, wrapped in Instruction).
# --------------------------------------------------------------------------


@dataclass
class KernelCall:
    """Schema: table KernelCall. Arguments in schema order, outputs last."""

    op_index: int
    args: list[int]


@dataclass
class DelegateCall:
    """Schema: table DelegateCall."""

    delegate_index: int
    args: list[int]


@dataclass
class MoveCall:
    """Schema: table MoveCall."""

    move_from: int
    move_to: int


@dataclass
class JumpFalseCall:
    """Schema: table JumpFalseCall. Jumps when the Bool value is false."""

    cond_value_index: int
    destination_instruction: int


@dataclass
class FreeCall:
    """Schema: table FreeCall."""

    value_index: int


Instruction = KernelCall | DelegateCall | MoveCall | JumpFalseCall | FreeCall
"""Schema: table Instruction; the member's class is the union's type tag."""

INSTRUCTION_TYPES: tuple[type, ...] = (KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall)


@dataclass
class Frame:
    """Schema: table Frame. One source frame of an instruction."""

    filename: str | None = None
    lineno: int = 0
    name: str | None = None
    context: str | None = None


@dataclass
class FrameList:
    """Schema: table FrameList. The frames of one instruction, outermost first."""

    items: list[Frame] = field(default_factory=list)


@dataclass
class Chain:
    """Schema: table Chain. `stacktrace` is empty or parallel to `instructions`."""

    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)
    stacktrace: list[FrameList] = field(default_factory=list)


# --------------------------------------------------------------------------
# Execution plans.
# --------------------------------------------------------------------------


@dataclass
class Operator:
    """Schema: table Operator, e.g. name `aten::add`, overload `out`."""

    name: str
    overload: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass
class CompileSpec:
    """Schema: table CompileSpec."""

    key: str
    value: bytes


@dataclass
class BackendDelegateDataReference:
    """Schema: table BackendDelegateDataReference."""

    location: DataLocation
    index: int


@dataclass
class BackendDelegate:
    """Schema: table BackendDelegate."""

    id: str
    processed: BackendDelegateDataReference
    compile_specs: list[CompileSpec] = field(default_factory=list)


@dataclass
class ContainerMetadata:
    """Schema: table ContainerMetadata (pytree specs of inputs and outputs)."""

    encoded_inp_str: str = ""
    encoded_out_str: str = ""


@dataclass
class NonConstBufferDevice:
    """Schema: table NonConstBufferDevice."""

    buffer_idx: int
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


@dataclass
class ExecutionPlan:
    """Schema: table ExecutionPlan. One method of the program."""

    name: str
    values: list[EValue] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    operators: list[Operator] = field(default_factory=list)
    delegates: list[BackendDelegate] = field(default_factory=list)
    # Entry 0 is reserved by convention; arena i has non_const_buffer_sizes[i] bytes.
    non_const_buffer_sizes: list[int] = field(default_factory=list)
    non_const_buffer_device: list[NonConstBufferDevice] = field(default_factory=list)
    container_meta_type: ContainerMetadata | None = None


# --------------------------------------------------------------------------
# Program.
# --------------------------------------------------------------------------


@dataclass
class Buffer:
    """Schema: table Buffer (constant data inside the FlatBuffer)."""

    storage: bytes


@dataclass
class BackendDelegateInlineData:
    """Schema: table BackendDelegateInlineData."""

    data: bytes


@dataclass
class DataSegment:
    """Schema: table DataSegment, carrying its bytes (offset/size are layout).

    `data` is `bytes`, or a `memoryview` into the mapped file when read from
    a path, so weights are not copied.
    """

    data: bytes | memoryview


@dataclass
class SubsegmentOffsets:
    """Schema: table SubsegmentOffsets. Sub-buffer starts inside a segment."""

    segment_index: int
    offsets: list[int] = field(default_factory=list)


@dataclass
class NamedData:
    """Schema: table NamedData."""

    key: str
    segment_index: int


@dataclass
class Program:
    """Schema: table Program, the root of a `.pte` file."""

    execution_plan: list[ExecutionPlan] = field(default_factory=list)
    version: int = SCHEMA_VERSION
    constant_buffer: list[Buffer] = field(default_factory=list)
    backend_delegate_data: list[BackendDelegateInlineData] = field(default_factory=list)
    segments: list[DataSegment] = field(default_factory=list)
    constant_segment: SubsegmentOffsets | None = None
    mutable_data_segments: list[SubsegmentOffsets] = field(default_factory=list)
    named_data: list[NamedData] = field(default_factory=list)

    def method(self, name: str) -> ExecutionPlan:
        for plan in self.execution_plan:
            if plan.name == name:
                return plan
        known = ", ".join(plan.name for plan in self.execution_plan) or "none"
        from exirc.errors import UsageError

        raise UsageError(f"no method named {name!r} in the program (methods: {known})")

    def named_segment(self, key: str) -> bytes | memoryview | None:
        """The data of the segment `named_data` names `key`, or None."""
        for named in self.named_data:
            if named.key == key and 0 <= named.segment_index < len(self.segments):
                return self.segments[named.segment_index].data
        return None

    def add_named_segment(self, key: str, data: bytes) -> None:
        """Store `data` in a new segment that `named_data` names `key`.

        Runtimes look named data up by key, so one that does not know the
        key ignores it (exirc keeps its own metadata there).
        """
        self.segments.append(DataSegment(data))
        self.named_data.append(NamedData(key, len(self.segments) - 1))

    def constant_count(self) -> int:
        """Number of constant buffers, counting the reserved entry 0."""
        if self.constant_segment is not None and self.constant_segment.offsets:
            return len(self.constant_segment.offsets)
        return len(self.constant_buffer)

    def constant_data(self, data_buffer_idx: int) -> bytes | memoryview:
        """The bytes of constant buffer `data_buffer_idx`, up to the next one.

        The tensor using it may use fewer bytes (trailing alignment padding).
        """
        segment = self.constant_segment
        if segment is not None and segment.offsets:
            data = self.segments[segment.segment_index].data
            start, end = constant_span(segment.offsets, data_buffer_idx, len(data))
            return data[start:end]
        return self.constant_buffer[data_buffer_idx].storage


def constant_span(offsets: list[int], index: int, segment_size: int) -> tuple[int, int]:
    """(start, end) of constant buffer `index` inside its segment.

    A buffer ends where the next one starts, or at the segment's end for the
    last; a next offset below this one (a malformed file) leaves it empty.
    """
    start = offsets[index]
    end = offsets[index + 1] if index + 1 < len(offsets) else segment_size
    return start, max(start, min(end, segment_size))


def pack_subsegments(buffers: list[bytes], alignment: int) -> tuple[bytes, list[int]]:
    """Concatenate `buffers`, each starting at a multiple of `alignment`.

    Returns the segment bytes and each buffer's offset, the form that
    `SubsegmentOffsets` stores.
    """
    out = bytearray()
    offsets = []
    for buf in buffers:
        out.extend(b"\0" * (-len(out) % alignment))
        offsets.append(len(out))
        out.extend(buf)
    return bytes(out), offsets
