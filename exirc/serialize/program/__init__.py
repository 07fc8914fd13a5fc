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

The model is one namespace (`from exirc.serialize import program as P`),
kept in files by concept:
  scalar_types  the element types
  values        the values of a plan: tensors, scalars, lists
  instructions  instructions, their source frames, chains
  plans         execution plans (methods), operators, delegates
  root          the Program table, its buffers, segments and named data
"""

from exirc.serialize.program.instructions import (
    INSTRUCTION_TYPES,
    Args,
    Chain,
    DelegateCall,
    Frame,
    FrameList,
    FreeCall,
    Instruction,
    JumpFalseCall,
    KernelCall,
    MoveCall,
)
from exirc.serialize.program.plans import (
    BackendDelegate,
    BackendDelegateDataReference,
    CompileSpec,
    ContainerMetadata,
    DataLocation,
    ExecutionPlan,
    NonConstBufferDevice,
    Operator,
)
from exirc.serialize.program.root import (
    CONSTANT_ALIGNMENT,
    SCHEMA_VERSION,
    BackendDelegateInlineData,
    Buffer,
    DataSegment,
    NamedData,
    Program,
    SubsegmentOffsets,
    constant_span,
    pack_subsegments,
)
from exirc.serialize.program.scalar_types import ScalarType
from exirc.serialize.program.values import (
    FIRST_SHARED_BUFFER,
    KERNEL_TYPES,
    AllocationDetails,
    Bool,
    BoolList,
    DeviceType,
    Double,
    DoubleList,
    EValue,
    ExtraTensorInfo,
    Int,
    IntList,
    Null,
    OptionalTensorList,
    String,
    Tensor,
    TensorDataLocation,
    TensorList,
    TensorShapeDynamism,
)

__all__ = [
    # scalar_types
    "ScalarType",
    # values
    "FIRST_SHARED_BUFFER", "KERNEL_TYPES", "AllocationDetails", "Bool", "BoolList",
    "DeviceType", "Double", "DoubleList", "EValue", "ExtraTensorInfo", "Int", "IntList",
    "Null", "OptionalTensorList", "String", "Tensor", "TensorDataLocation", "TensorList",
    "TensorShapeDynamism",
    # instructions
    "INSTRUCTION_TYPES", "Args", "Chain", "DelegateCall", "Frame", "FrameList", "FreeCall",
    "Instruction", "JumpFalseCall", "KernelCall", "MoveCall",
    # plans
    "BackendDelegate", "BackendDelegateDataReference", "CompileSpec", "ContainerMetadata",
    "DataLocation", "ExecutionPlan", "NonConstBufferDevice", "Operator",
    # root
    "CONSTANT_ALIGNMENT", "SCHEMA_VERSION", "BackendDelegateInlineData", "Buffer",
    "DataSegment", "NamedData", "Program", "SubsegmentOffsets", "constant_span",
    "pack_subsegments",
]
