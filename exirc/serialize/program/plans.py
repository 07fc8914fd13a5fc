"""Execution plans (schema: table ExecutionPlan): one method each, with the
operators and delegates its instructions call."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from exirc.serialize.program.instructions import Chain
from exirc.serialize.program.values import DeviceType, EValue


class DataLocation(enum.IntEnum):
    """Schema: enum DataLocation (where a delegate's payload is)."""

    INLINE = 0
    SEGMENT = 1


@dataclass(slots=True)
class Operator:
    """Schema: table Operator, e.g. name `aten::add`, overload `out`."""

    name: str
    overload: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass(slots=True)
class CompileSpec:
    """Schema: table CompileSpec."""

    key: str
    value: bytes


@dataclass(slots=True)
class BackendDelegateDataReference:
    """Schema: table BackendDelegateDataReference."""

    location: DataLocation
    index: int


@dataclass(slots=True)
class BackendDelegate:
    """Schema: table BackendDelegate."""

    id: str
    processed: BackendDelegateDataReference
    compile_specs: list[CompileSpec] = field(default_factory=list)


@dataclass(slots=True)
class ContainerMetadata:
    """Schema: table ContainerMetadata (pytree specs of inputs and outputs)."""

    encoded_inp_str: str = ""
    encoded_out_str: str = ""


@dataclass(slots=True)
class NonConstBufferDevice:
    """Schema: table NonConstBufferDevice."""

    buffer_idx: int
    device_type: DeviceType = DeviceType.CPU
    device_index: int = 0


@dataclass(slots=True)
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
