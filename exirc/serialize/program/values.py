"""Values: schema union KernelTypes, wrapped in table EValue, and the tensor tables."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from exirc.serialize.program.scalar_types import ScalarType


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


@dataclass(slots=True)
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


@dataclass(slots=True)
class ExtraTensorInfo:
    """Schema: table ExtraTensorInfo."""

    mutable_data_segments_idx: int = 0
    fully_qualified_name: str | None = None
    location: TensorDataLocation = TensorDataLocation.SEGMENT
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


@dataclass(slots=True)
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


@dataclass(slots=True)
class Null:
    """Schema: table Null (None, e.g. an absent optional argument)."""


@dataclass(slots=True)
class Int:
    """Schema: table Int."""

    int_val: int


@dataclass(slots=True)
class Bool:
    """Schema: table Bool."""

    bool_val: bool


@dataclass(slots=True)
class Double:
    """Schema: table Double."""

    double_val: float


@dataclass(slots=True)
class String:
    """Schema: table String."""

    string_val: str


@dataclass(slots=True)
class IntList:
    """Schema: table IntList. Holds value indices of `Int` values, not ints.

    Boxing each int lets a list mix constants with sizes computed at run time
    (SymInts), e.g. the shape argument of a `view_copy` under dynamic shapes.
    """

    items: list[int]


@dataclass(slots=True)
class DoubleList:
    """Schema: table DoubleList."""

    items: list[float]


@dataclass(slots=True)
class BoolList:
    """Schema: table BoolList."""

    items: list[bool]


@dataclass(slots=True)
class TensorList:
    """Schema: table TensorList. Holds value indices of tensors."""

    items: list[int]


@dataclass(slots=True)
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
