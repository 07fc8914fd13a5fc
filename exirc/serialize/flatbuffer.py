"""Program model -> the FlatBuffer of a `.pte` file (without its header and segments).

The FlatBuffer is built bottom-up with the flatc-generated builder functions:
children before parents, as FlatBuffers requires. `exirc.serialize.writer`
puts the header and the data segments around it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import flatbuffers

from exirc.errors import InternalError
from exirc.serialize import program as P
from exirc.serialize.generated import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Bool,
    BoolList,
    Buffer,
    Chain,
    CompileSpec,
    ContainerMetadata,
    DataSegment,
    DelegateCall,
    Double,
    DoubleList,
    EValue,
    ExecutionPlan,
    ExtraTensorInfo,
    Frame,
    FrameList,
    FreeCall,
    Instruction,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    NamedData,
    NonConstBufferDevice,
    Null,
    Operator,
    OptionalTensorList,
    Program,
    String,
    SubsegmentOffsets,
    Tensor,
    TensorList,
)
from exirc.serialize.header import FILE_IDENTIFIER

# The schema's force_align for inline tensor and delegate data, the largest
# alignment of anything in the FlatBuffer.
FORCE_ALIGN = 16


class FlatBufferWriter:
    """Builds the FlatBuffer of one Program; one method per schema table."""

    def __init__(self, segment_offsets: list[int]) -> None:
        self.b = flatbuffers.Builder(1024)
        self.segment_offsets = segment_offsets
        # Instructions from one source line carry the same frames: store each
        # distinct frame list once and point at it (a FlatBuffer may share).
        self._frame_lists: dict[tuple[tuple[Any, ...], ...], int] = {}
        # Scalar vectors by (element writer, items): the same sizes, dim order
        # or arguments are stored once and shared by every table using them.
        self._scalar_vectors: dict[tuple[Any, tuple[Any, ...]], int] = {}

    # -- helpers ---------------------------------------------------------

    def _table(self, table: ModuleType, *fields: tuple[Callable[[Any, Any], None], Any]) -> int:
        """Build one table of the generated module `table`: each (add, value)
        of `fields` in order, leaving out those whose value is None.

        The values are built already: FlatBuffers builds children first, and
        the order of both is part of the bytes written.
        """
        table.Start(self.b)
        for add, value in fields:
            if value is not None:
                add(self.b, value)
        return int(table.End(self.b))

    def _vector(self, start: Callable[[Any, int], Any], prepend: Callable[[Any], None],
                items: Sequence[Any]) -> int:
        """A vector of scalars, stored once however many tables use it: a
        FlatBuffer may share any sub-object, and readers only follow offsets."""
        key = (getattr(prepend, "__func__", prepend), tuple(items))
        shared = self._scalar_vectors.get(key)
        if shared is None:
            shared = self._scalar_vectors[key] = self._new_vector(start, prepend, items)
        return shared

    def _new_vector(self, start: Callable[[Any, int], Any], prepend: Callable[[Any], None],
                    items: Sequence[Any]) -> int:
        start(self.b, len(items))
        for item in reversed(items):
            prepend(item)
        return int(self.b.EndVector())

    def _offsets(self, start: Callable[[Any, int], Any], offsets: Sequence[int]) -> int:
        # Never shared: an offset is relative to where it is stored, so equal
        # offset lists are not equal bytes (and rarely recur anyway).
        return self._new_vector(start, self.b.PrependUOffsetTRelative, offsets)

    def _bytes(self, data: bytes | memoryview, alignment: int = 1) -> int:
        # Like Builder.CreateByteVector, with an alignment: the generated
        # start functions ignore the schema's force_align.
        self.b.StartVector(1, len(data), alignment)
        self.b.head -= len(data)
        self.b.Bytes[self.b.head:self.b.head + len(data)] = data
        return int(self.b.EndVector())

    def _string(self, text: str | None) -> int | None:
        return None if text is None else int(self.b.CreateString(text))

    def _shared_string(self, text: str | None) -> int | None:
        """A string stored once however often it is used (file names, code lines)."""
        return None if text is None else int(self.b.CreateSharedString(text))

    # -- tables ----------------------------------------------------------

    def program(self, program: P.Program) -> bytes:
        plans = [self.execution_plan(plan) for plan in program.execution_plan]
        buffers = [self.buffer(buffer) for buffer in program.constant_buffer]
        inline = [self.inline_data(data) for data in program.backend_delegate_data]
        segments = [self.data_segment(segment, offset)
                    for segment, offset in zip(program.segments, self.segment_offsets)]
        constant_segment = (None if program.constant_segment is None
                            else self.subsegment_offsets(program.constant_segment))
        mutable = [self.subsegment_offsets(s) for s in program.mutable_data_segments]
        named = [self.named_data(n) for n in program.named_data]

        plans_vec = self._offsets(Program.StartExecutionPlanVector, plans)
        buffers_vec = self._offsets(Program.StartConstantBufferVector, buffers)
        inline_vec = self._offsets(Program.StartBackendDelegateDataVector, inline)
        segments_vec = self._offsets(Program.StartSegmentsVector, segments)
        mutable_vec = self._offsets(Program.StartMutableDataSegmentsVector, mutable) \
            if mutable else None
        named_vec = self._offsets(Program.StartNamedDataVector, named) if named else None

        root = self._table(
            Program,
            (Program.AddVersion, program.version),
            (Program.AddExecutionPlan, plans_vec),
            (Program.AddConstantBuffer, buffers_vec),
            (Program.AddBackendDelegateData, inline_vec),
            (Program.AddSegments, segments_vec),
            (Program.AddConstantSegment, constant_segment),
            (Program.AddMutableDataSegments, mutable_vec),
            (Program.AddNamedData, named_vec),
        )
        self.b.Finish(root, file_identifier=FILE_IDENTIFIER)
        return bytes(self.b.Output())

    def buffer(self, buffer: P.Buffer) -> int:
        return self._table(Buffer, (Buffer.AddStorage, self._bytes(buffer.storage, FORCE_ALIGN)))

    def inline_data(self, inline: P.BackendDelegateInlineData) -> int:
        data = self._bytes(inline.data, FORCE_ALIGN)
        return self._table(BackendDelegateInlineData, (BackendDelegateInlineData.AddData, data))

    def data_segment(self, segment: P.DataSegment, offset: int) -> int:
        return self._table(DataSegment, (DataSegment.AddOffset, offset),
                           (DataSegment.AddSize, len(segment.data)))

    def subsegment_offsets(self, sub: P.SubsegmentOffsets) -> int:
        offsets = self._vector(SubsegmentOffsets.StartOffsetsVector, self.b.PrependUint64,
                               sub.offsets)
        return self._table(SubsegmentOffsets,
                           (SubsegmentOffsets.AddSegmentIndex, sub.segment_index),
                           (SubsegmentOffsets.AddOffsets, offsets))

    def named_data(self, named: P.NamedData) -> int:
        return self._table(NamedData, (NamedData.AddKey, self._string(named.key)),
                           (NamedData.AddSegmentIndex, named.segment_index))

    def execution_plan(self, plan: P.ExecutionPlan) -> int:
        b = self.b
        name = self._string(plan.name)
        meta = None if plan.container_meta_type is None else \
            self.container_metadata(plan.container_meta_type)
        values = self._offsets(ExecutionPlan.StartValuesVector,
                               [self.evalue(value) for value in plan.values])
        inputs = self._vector(ExecutionPlan.StartInputsVector, b.PrependInt32, plan.inputs)
        outputs = self._vector(ExecutionPlan.StartOutputsVector, b.PrependInt32, plan.outputs)
        chains = self._offsets(ExecutionPlan.StartChainsVector,
                               [self.chain(chain) for chain in plan.chains])
        operators = self._offsets(ExecutionPlan.StartOperatorsVector,
                                  [self.operator(op) for op in plan.operators])
        delegates = self._offsets(ExecutionPlan.StartDelegatesVector,
                                  [self.delegate(d) for d in plan.delegates])
        sizes = self._vector(ExecutionPlan.StartNonConstBufferSizesVector, b.PrependInt64,
                             plan.non_const_buffer_sizes)
        devices = None
        if plan.non_const_buffer_device:
            devices = self._offsets(ExecutionPlan.StartNonConstBufferDeviceVector,
                                    [self.buffer_device(d) for d in plan.non_const_buffer_device])
        return self._table(
            ExecutionPlan,
            (ExecutionPlan.AddName, name),
            (ExecutionPlan.AddContainerMetaType, meta),
            (ExecutionPlan.AddValues, values),
            (ExecutionPlan.AddInputs, inputs),
            (ExecutionPlan.AddOutputs, outputs),
            (ExecutionPlan.AddChains, chains),
            (ExecutionPlan.AddOperators, operators),
            (ExecutionPlan.AddDelegates, delegates),
            (ExecutionPlan.AddNonConstBufferSizes, sizes),
            (ExecutionPlan.AddNonConstBufferDevice, devices),
        )

    def container_metadata(self, meta: P.ContainerMetadata) -> int:
        return self._table(ContainerMetadata,
                           (ContainerMetadata.AddEncodedInpStr, self._string(meta.encoded_inp_str)),
                           (ContainerMetadata.AddEncodedOutStr, self._string(meta.encoded_out_str)))

    def buffer_device(self, device: P.NonConstBufferDevice) -> int:
        return self._table(NonConstBufferDevice,
                           (NonConstBufferDevice.AddBufferIdx, device.buffer_idx),
                           (NonConstBufferDevice.AddDeviceType, int(device.device_type)),
                           (NonConstBufferDevice.AddDeviceIndex, device.device_index))

    def operator(self, op: P.Operator) -> int:
        return self._table(Operator, (Operator.AddName, self._string(op.name)),
                           (Operator.AddOverload, self._string(op.overload)))

    def delegate(self, delegate: P.BackendDelegate) -> int:
        ident = self._string(delegate.id)
        processed = self._table(
            BackendDelegateDataReference,
            (BackendDelegateDataReference.AddLocation, int(delegate.processed.location)),
            (BackendDelegateDataReference.AddIndex, delegate.processed.index))
        specs = [self._table(CompileSpec, (CompileSpec.AddKey, self._string(spec.key)),
                             (CompileSpec.AddValue, self._bytes(spec.value)))
                 for spec in delegate.compile_specs]
        specs_vec = self._offsets(BackendDelegate.StartCompileSpecsVector, specs)
        return self._table(BackendDelegate, (BackendDelegate.AddId, ident),
                           (BackendDelegate.AddProcessed, processed),
                           (BackendDelegate.AddCompileSpecs, specs_vec))

    def chain(self, chain: P.Chain) -> int:
        b = self.b
        inputs = self._vector(Chain.StartInputsVector, b.PrependInt32, chain.inputs)
        outputs = self._vector(Chain.StartOutputsVector, b.PrependInt32, chain.outputs)
        instructions = self._offsets(Chain.StartInstructionsVector,
                                     [self.instruction(i) for i in chain.instructions])
        stacktrace = None
        if chain.stacktrace:
            stacktrace = self._offsets(Chain.StartStacktraceVector,
                                       [self.frame_list(f) for f in chain.stacktrace])
        return self._table(Chain, (Chain.AddInputs, inputs), (Chain.AddOutputs, outputs),
                           (Chain.AddInstructions, instructions),
                           (Chain.AddStacktrace, stacktrace))

    def frame_list(self, frames: P.FrameList) -> int:
        key = tuple((f.filename, f.lineno, f.name, f.context) for f in frames.items)
        shared = self._frame_lists.get(key)
        if shared is None:
            shared = self._frame_lists[key] = self._new_frame_list(frames)
        return shared

    def _new_frame_list(self, frames: P.FrameList) -> int:
        items = [self._table(Frame, (Frame.AddFilename, self._shared_string(frame.filename)),
                             (Frame.AddLineno, frame.lineno),
                             (Frame.AddName, self._shared_string(frame.name)),
                             (Frame.AddContext, self._shared_string(frame.context)))
                 for frame in frames.items]
        vec = self._offsets(FrameList.StartItemsVector, items)
        return self._table(FrameList, (FrameList.AddItems, vec))

    def instruction(self, instr: P.Instruction) -> int:
        b = self.b
        if isinstance(instr, P.KernelCall):
            args = self._vector(KernelCall.StartArgsVector, b.PrependInt32, instr.args)
            body = self._table(KernelCall, (KernelCall.AddOpIndex, instr.op_index),
                               (KernelCall.AddArgs, args))
        elif isinstance(instr, P.DelegateCall):
            args = self._vector(DelegateCall.StartArgsVector, b.PrependInt32, instr.args)
            body = self._table(DelegateCall, (DelegateCall.AddDelegateIndex, instr.delegate_index),
                               (DelegateCall.AddArgs, args))
        elif isinstance(instr, P.MoveCall):
            body = self._table(MoveCall, (MoveCall.AddMoveFrom, instr.move_from),
                               (MoveCall.AddMoveTo, instr.move_to))
        elif isinstance(instr, P.JumpFalseCall):
            body = self._table(
                JumpFalseCall, (JumpFalseCall.AddCondValueIndex, instr.cond_value_index),
                (JumpFalseCall.AddDestinationInstruction, instr.destination_instruction))
        elif isinstance(instr, P.FreeCall):
            body = self._table(FreeCall, (FreeCall.AddValueIndex, instr.value_index))
        else:
            raise InternalError(f"not an instruction: {instr!r}")
        return self._table(
            Instruction,
            (Instruction.AddInstrArgsType, P.INSTRUCTION_TYPES.index(type(instr)) + 1),
            (Instruction.AddInstrArgs, body))

    def evalue(self, value: P.EValue) -> int:
        body = self.kernel_type(value)
        return self._table(EValue, (EValue.AddValType, P.KERNEL_TYPES.index(type(value)) + 1),
                           (EValue.AddVal, body))

    def kernel_type(self, value: P.EValue) -> int:
        b = self.b
        if isinstance(value, P.Tensor):
            return self.tensor(value)
        if isinstance(value, P.Null):
            return self._table(Null)
        if isinstance(value, P.Int):
            return self._table(Int, (Int.AddIntVal, value.int_val))
        if isinstance(value, P.Bool):
            return self._table(Bool, (Bool.AddBoolVal, value.bool_val))
        if isinstance(value, P.Double):
            return self._table(Double, (Double.AddDoubleVal, value.double_val))
        if isinstance(value, P.String):
            return self._table(String, (String.AddStringVal, self._string(value.string_val)))
        if isinstance(value, P.IntList):
            return self._list(IntList, b.PrependInt64, value.items)
        if isinstance(value, P.DoubleList):
            return self._list(DoubleList, b.PrependFloat64, value.items)
        if isinstance(value, P.BoolList):
            return self._list(BoolList, b.PrependBool, value.items)
        if isinstance(value, P.TensorList):
            return self._list(TensorList, b.PrependInt32, value.items)
        if isinstance(value, P.OptionalTensorList):
            return self._list(OptionalTensorList, b.PrependInt32, value.items)
        raise InternalError(f"not a program value: {value!r}")

    def _list(self, table: ModuleType, prepend: Callable[[Any], None],
              items: Sequence[Any]) -> int:
        """One of the list values: a table of one vector, `items`."""
        vector = self._vector(table.StartItemsVector, prepend, items)
        return self._table(table, (table.AddItems, vector))

    def tensor(self, tensor: P.Tensor) -> int:
        b = self.b
        sizes = self._vector(Tensor.StartSizesVector, b.PrependInt32, tensor.sizes)
        dim_order = self._vector(Tensor.StartDimOrderVector, b.PrependUint8, tensor.dim_order)
        allocation = None
        if tensor.allocation_info is not None:
            allocation = self.allocation_details(tensor.allocation_info)
        extra = None
        if tensor.extra_tensor_info is not None:
            extra = self.extra_tensor_info(tensor.extra_tensor_info)
        return self._table(
            Tensor,
            (Tensor.AddScalarType, int(tensor.scalar_type)),
            (Tensor.AddStorageOffset, tensor.storage_offset),
            (Tensor.AddSizes, sizes),
            (Tensor.AddDimOrder, dim_order),
            (Tensor.AddRequiresGrad, tensor.requires_grad),
            (Tensor.AddDataBufferIdx, tensor.data_buffer_idx),
            (Tensor.AddAllocationInfo, allocation),
            (Tensor.AddLayout, tensor.layout),
            (Tensor.AddShapeDynamism, int(tensor.shape_dynamism)),
            (Tensor.AddExtraTensorInfo, extra),
        )

    def allocation_details(self, info: P.AllocationDetails) -> int:
        return self._table(AllocationDetails,
                           (AllocationDetails.AddMemoryId, info.memory_id),
                           (AllocationDetails.AddMemoryOffsetLow, info.memory_offset_low),
                           (AllocationDetails.AddMemoryOffsetHigh, info.memory_offset_high))

    def extra_tensor_info(self, extra: P.ExtraTensorInfo) -> int:
        return self._table(
            ExtraTensorInfo,
            (ExtraTensorInfo.AddMutableDataSegmentsIdx, extra.mutable_data_segments_idx),
            (ExtraTensorInfo.AddFullyQualifiedName, self._string(extra.fully_qualified_name)),
            (ExtraTensorInfo.AddLocation, int(extra.location)),
            (ExtraTensorInfo.AddDeviceType, int(extra.device_type)),
            (ExtraTensorInfo.AddDeviceIndex, extra.device_index),
        )
