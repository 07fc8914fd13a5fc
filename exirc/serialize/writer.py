"""Program model -> `.pte` bytes.

The FlatBuffer is built bottom-up with the flatc-generated builder functions
(children before parents, as FlatBuffers requires), the extended header is
inserted at byte 8, and the data segments follow at aligned offsets.
Serializing the same program twice gives identical bytes: nothing here
depends on dict order of unordered data, time or addresses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
from exirc.serialize.header import (
    FILE_IDENTIFIER,
    HEADER_LENGTH,
    HEADER_OFFSET,
    SEGMENT_ALIGNMENT,
    ExtendedHeader,
    align_up,
)

# The schema's force_align for inline tensor and delegate data.
_FORCE_ALIGN = 16
# The FlatBuffer's own alignment never exceeds this, so inserting a header
# of a multiple of it keeps every field aligned.
_MAX_FLATBUFFER_ALIGNMENT = _FORCE_ALIGN


def serialize(program: P.Program, *, segment_alignment: int = SEGMENT_ALIGNMENT) -> bytes:
    """Return the `.pte` bytes of `program`."""
    segment_offsets = _segment_offsets(program.segments, segment_alignment)
    flatbuffer = _FlatBufferWriter(segment_offsets).program(program)
    return _insert_header(flatbuffer, program.segments, segment_offsets, segment_alignment)


def _segment_offsets(segments: Sequence[P.DataSegment], alignment: int) -> list[int]:
    """Offsets of each segment from the segment base, each aligned."""
    offsets = []
    end = 0
    for segment in segments:
        start = align_up(end, alignment)
        offsets.append(start)
        end = start + len(segment.data)
    return offsets


def _insert_header(flatbuffer: bytes, segments: Sequence[P.DataSegment],
                   segment_offsets: list[int], segment_alignment: int) -> bytes:
    # Offsets inside a FlatBuffer are relative to where they are stored, so
    # inserting bytes after the root offset only moves the root offset.
    if HEADER_LENGTH % _MAX_FLATBUFFER_ALIGNMENT:
        raise InternalError("extended header length breaks FlatBuffer alignment")
    root_offset = int.from_bytes(flatbuffer[0:4], "little") + HEADER_LENGTH
    program_size = len(flatbuffer) + HEADER_LENGTH
    # Without segments the base is the end of the program, not a padded
    # offset past the end of the file.
    segment_base = program_size
    segment_data_size = 0
    if segments:
        segment_base = align_up(program_size, segment_alignment)
        segment_data_size = segment_offsets[-1] + len(segments[-1].data)
    header = ExtendedHeader(program_size, segment_base, segment_data_size)

    out = bytearray()
    out += root_offset.to_bytes(4, "little")
    out += flatbuffer[4:HEADER_OFFSET]
    out += header.to_bytes()
    out += flatbuffer[HEADER_OFFSET:]
    for segment, offset in zip(segments, segment_offsets):
        out += b"\0" * (segment_base + offset - len(out))
        out += segment.data
    return bytes(out)


class _FlatBufferWriter:
    """Builds the FlatBuffer of one Program; one method per schema table."""

    def __init__(self, segment_offsets: list[int]) -> None:
        self.b = flatbuffers.Builder(1024)
        self.segment_offsets = segment_offsets
        # Instructions from one source line carry the same frames: store each
        # distinct frame list once and point at it (a FlatBuffer may share).
        self._frame_lists: dict[tuple[tuple[Any, ...], ...], int] = {}

    # -- helpers ---------------------------------------------------------

    def _vector(self, start: Callable[[Any, int], Any], prepend: Callable[[Any], None],
                items: Sequence[Any]) -> int:
        start(self.b, len(items))
        for item in reversed(items):
            prepend(item)
        return int(self.b.EndVector())

    def _offsets(self, start: Callable[[Any, int], Any], offsets: Sequence[int]) -> int:
        return self._vector(start, self.b.PrependUOffsetTRelative, offsets)

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
        b = self.b
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

        Program.Start(b)
        Program.AddVersion(b, program.version)
        Program.AddExecutionPlan(b, plans_vec)
        Program.AddConstantBuffer(b, buffers_vec)
        Program.AddBackendDelegateData(b, inline_vec)
        Program.AddSegments(b, segments_vec)
        if constant_segment is not None:
            Program.AddConstantSegment(b, constant_segment)
        if mutable_vec is not None:
            Program.AddMutableDataSegments(b, mutable_vec)
        if named_vec is not None:
            Program.AddNamedData(b, named_vec)
        root = Program.End(b)
        b.Finish(root, file_identifier=FILE_IDENTIFIER)
        return bytes(b.Output())

    def buffer(self, buffer: P.Buffer) -> int:
        storage = self._bytes(buffer.storage, _FORCE_ALIGN)
        Buffer.Start(self.b)
        Buffer.AddStorage(self.b, storage)
        return int(Buffer.End(self.b))

    def inline_data(self, inline: P.BackendDelegateInlineData) -> int:
        data = self._bytes(inline.data, _FORCE_ALIGN)
        BackendDelegateInlineData.Start(self.b)
        BackendDelegateInlineData.AddData(self.b, data)
        return int(BackendDelegateInlineData.End(self.b))

    def data_segment(self, segment: P.DataSegment, offset: int) -> int:
        DataSegment.Start(self.b)
        DataSegment.AddOffset(self.b, offset)
        DataSegment.AddSize(self.b, len(segment.data))
        return int(DataSegment.End(self.b))

    def subsegment_offsets(self, sub: P.SubsegmentOffsets) -> int:
        offsets = self._vector(SubsegmentOffsets.StartOffsetsVector, self.b.PrependUint64,
                               sub.offsets)
        SubsegmentOffsets.Start(self.b)
        SubsegmentOffsets.AddSegmentIndex(self.b, sub.segment_index)
        SubsegmentOffsets.AddOffsets(self.b, offsets)
        return int(SubsegmentOffsets.End(self.b))

    def named_data(self, named: P.NamedData) -> int:
        key = self._string(named.key)
        NamedData.Start(self.b)
        if key is not None:
            NamedData.AddKey(self.b, key)
        NamedData.AddSegmentIndex(self.b, named.segment_index)
        return int(NamedData.End(self.b))

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

        ExecutionPlan.Start(b)
        if name is not None:
            ExecutionPlan.AddName(b, name)
        if meta is not None:
            ExecutionPlan.AddContainerMetaType(b, meta)
        ExecutionPlan.AddValues(b, values)
        ExecutionPlan.AddInputs(b, inputs)
        ExecutionPlan.AddOutputs(b, outputs)
        ExecutionPlan.AddChains(b, chains)
        ExecutionPlan.AddOperators(b, operators)
        ExecutionPlan.AddDelegates(b, delegates)
        ExecutionPlan.AddNonConstBufferSizes(b, sizes)
        if devices is not None:
            ExecutionPlan.AddNonConstBufferDevice(b, devices)
        return int(ExecutionPlan.End(b))

    def container_metadata(self, meta: P.ContainerMetadata) -> int:
        inp = self._string(meta.encoded_inp_str)
        out = self._string(meta.encoded_out_str)
        ContainerMetadata.Start(self.b)
        if inp is not None:
            ContainerMetadata.AddEncodedInpStr(self.b, inp)
        if out is not None:
            ContainerMetadata.AddEncodedOutStr(self.b, out)
        return int(ContainerMetadata.End(self.b))

    def buffer_device(self, device: P.NonConstBufferDevice) -> int:
        NonConstBufferDevice.Start(self.b)
        NonConstBufferDevice.AddBufferIdx(self.b, device.buffer_idx)
        NonConstBufferDevice.AddDeviceType(self.b, int(device.device_type))
        NonConstBufferDevice.AddDeviceIndex(self.b, device.device_index)
        return int(NonConstBufferDevice.End(self.b))

    def operator(self, op: P.Operator) -> int:
        name = self._string(op.name)
        overload = self._string(op.overload)
        Operator.Start(self.b)
        if name is not None:
            Operator.AddName(self.b, name)
        if overload is not None:
            Operator.AddOverload(self.b, overload)
        return int(Operator.End(self.b))

    def delegate(self, delegate: P.BackendDelegate) -> int:
        b = self.b
        ident = self._string(delegate.id)
        BackendDelegateDataReference.Start(b)
        BackendDelegateDataReference.AddLocation(b, int(delegate.processed.location))
        BackendDelegateDataReference.AddIndex(b, delegate.processed.index)
        processed = BackendDelegateDataReference.End(b)
        specs = []
        for spec in delegate.compile_specs:
            key = self._string(spec.key)
            value = self._bytes(spec.value)
            CompileSpec.Start(b)
            if key is not None:
                CompileSpec.AddKey(b, key)
            CompileSpec.AddValue(b, value)
            specs.append(CompileSpec.End(b))
        specs_vec = self._offsets(BackendDelegate.StartCompileSpecsVector, specs)
        BackendDelegate.Start(b)
        if ident is not None:
            BackendDelegate.AddId(b, ident)
        BackendDelegate.AddProcessed(b, processed)
        BackendDelegate.AddCompileSpecs(b, specs_vec)
        return int(BackendDelegate.End(b))

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
        Chain.Start(b)
        Chain.AddInputs(b, inputs)
        Chain.AddOutputs(b, outputs)
        Chain.AddInstructions(b, instructions)
        if stacktrace is not None:
            Chain.AddStacktrace(b, stacktrace)
        return int(Chain.End(b))

    def frame_list(self, frames: P.FrameList) -> int:
        key = tuple((f.filename, f.lineno, f.name, f.context) for f in frames.items)
        shared = self._frame_lists.get(key)
        if shared is None:
            shared = self._frame_lists[key] = self._new_frame_list(frames)
        return shared

    def _new_frame_list(self, frames: P.FrameList) -> int:
        items = []
        for frame in frames.items:
            filename = self._shared_string(frame.filename)
            name = self._shared_string(frame.name)
            context = self._shared_string(frame.context)
            Frame.Start(self.b)
            if filename is not None:
                Frame.AddFilename(self.b, filename)
            Frame.AddLineno(self.b, frame.lineno)
            if name is not None:
                Frame.AddName(self.b, name)
            if context is not None:
                Frame.AddContext(self.b, context)
            items.append(Frame.End(self.b))
        vec = self._offsets(FrameList.StartItemsVector, items)
        FrameList.Start(self.b)
        FrameList.AddItems(self.b, vec)
        return int(FrameList.End(self.b))

    def instruction(self, instr: P.Instruction) -> int:
        b = self.b
        if isinstance(instr, P.KernelCall):
            args = self._vector(KernelCall.StartArgsVector, b.PrependInt32, instr.args)
            KernelCall.Start(b)
            KernelCall.AddOpIndex(b, instr.op_index)
            KernelCall.AddArgs(b, args)
            body = KernelCall.End(b)
        elif isinstance(instr, P.DelegateCall):
            args = self._vector(DelegateCall.StartArgsVector, b.PrependInt32, instr.args)
            DelegateCall.Start(b)
            DelegateCall.AddDelegateIndex(b, instr.delegate_index)
            DelegateCall.AddArgs(b, args)
            body = DelegateCall.End(b)
        elif isinstance(instr, P.MoveCall):
            MoveCall.Start(b)
            MoveCall.AddMoveFrom(b, instr.move_from)
            MoveCall.AddMoveTo(b, instr.move_to)
            body = MoveCall.End(b)
        elif isinstance(instr, P.JumpFalseCall):
            JumpFalseCall.Start(b)
            JumpFalseCall.AddCondValueIndex(b, instr.cond_value_index)
            JumpFalseCall.AddDestinationInstruction(b, instr.destination_instruction)
            body = JumpFalseCall.End(b)
        elif isinstance(instr, P.FreeCall):
            FreeCall.Start(b)
            FreeCall.AddValueIndex(b, instr.value_index)
            body = FreeCall.End(b)
        else:
            raise InternalError(f"not an instruction: {instr!r}")
        Instruction.Start(b)
        Instruction.AddInstrArgsType(b, P.INSTRUCTION_TYPES.index(type(instr)) + 1)
        Instruction.AddInstrArgs(b, body)
        return int(Instruction.End(b))

    def evalue(self, value: P.EValue) -> int:
        body = self.kernel_type(value)
        EValue.Start(self.b)
        EValue.AddValType(self.b, P.KERNEL_TYPES.index(type(value)) + 1)
        EValue.AddVal(self.b, body)
        return int(EValue.End(self.b))

    def kernel_type(self, value: P.EValue) -> int:
        b = self.b
        if isinstance(value, P.Tensor):
            return self.tensor(value)
        if isinstance(value, P.Null):
            Null.Start(b)
            return int(Null.End(b))
        if isinstance(value, P.Int):
            Int.Start(b)
            Int.AddIntVal(b, value.int_val)
            return int(Int.End(b))
        if isinstance(value, P.Bool):
            Bool.Start(b)
            Bool.AddBoolVal(b, value.bool_val)
            return int(Bool.End(b))
        if isinstance(value, P.Double):
            Double.Start(b)
            Double.AddDoubleVal(b, value.double_val)
            return int(Double.End(b))
        if isinstance(value, P.String):
            text = self._string(value.string_val)
            String.Start(b)
            if text is not None:
                String.AddStringVal(b, text)
            return int(String.End(b))
        return self._list(value)

    def _list(self, value: P.EValue) -> int:
        b = self.b
        if isinstance(value, P.IntList):
            items = self._vector(IntList.StartItemsVector, b.PrependInt64, value.items)
            IntList.Start(b)
            IntList.AddItems(b, items)
            return int(IntList.End(b))
        if isinstance(value, P.DoubleList):
            items = self._vector(DoubleList.StartItemsVector, b.PrependFloat64, value.items)
            DoubleList.Start(b)
            DoubleList.AddItems(b, items)
            return int(DoubleList.End(b))
        if isinstance(value, P.BoolList):
            items = self._vector(BoolList.StartItemsVector, b.PrependBool, value.items)
            BoolList.Start(b)
            BoolList.AddItems(b, items)
            return int(BoolList.End(b))
        if isinstance(value, P.TensorList):
            items = self._vector(TensorList.StartItemsVector, b.PrependInt32, value.items)
            TensorList.Start(b)
            TensorList.AddItems(b, items)
            return int(TensorList.End(b))
        if isinstance(value, P.OptionalTensorList):
            items = self._vector(OptionalTensorList.StartItemsVector, b.PrependInt32,
                                 value.items)
            OptionalTensorList.Start(b)
            OptionalTensorList.AddItems(b, items)
            return int(OptionalTensorList.End(b))
        raise InternalError(f"not a program value: {value!r}")

    def tensor(self, tensor: P.Tensor) -> int:
        b = self.b
        sizes = self._vector(Tensor.StartSizesVector, b.PrependInt32, tensor.sizes)
        dim_order = self._vector(Tensor.StartDimOrderVector, b.PrependUint8, tensor.dim_order)
        allocation = None
        if tensor.allocation_info is not None:
            info = tensor.allocation_info
            AllocationDetails.Start(b)
            AllocationDetails.AddMemoryId(b, info.memory_id)
            AllocationDetails.AddMemoryOffsetLow(b, info.memory_offset_low)
            AllocationDetails.AddMemoryOffsetHigh(b, info.memory_offset_high)
            allocation = AllocationDetails.End(b)
        extra = None
        if tensor.extra_tensor_info is not None:
            extra = self.extra_tensor_info(tensor.extra_tensor_info)
        Tensor.Start(b)
        Tensor.AddScalarType(b, int(tensor.scalar_type))
        Tensor.AddStorageOffset(b, tensor.storage_offset)
        Tensor.AddSizes(b, sizes)
        Tensor.AddDimOrder(b, dim_order)
        Tensor.AddRequiresGrad(b, tensor.requires_grad)
        Tensor.AddDataBufferIdx(b, tensor.data_buffer_idx)
        if allocation is not None:
            Tensor.AddAllocationInfo(b, allocation)
        Tensor.AddLayout(b, tensor.layout)
        Tensor.AddShapeDynamism(b, int(tensor.shape_dynamism))
        if extra is not None:
            Tensor.AddExtraTensorInfo(b, extra)
        return int(Tensor.End(b))

    def extra_tensor_info(self, extra: P.ExtraTensorInfo) -> int:
        b = self.b
        name = self._string(extra.fully_qualified_name)
        ExtraTensorInfo.Start(b)
        ExtraTensorInfo.AddMutableDataSegmentsIdx(b, extra.mutable_data_segments_idx)
        if name is not None:
            ExtraTensorInfo.AddFullyQualifiedName(b, name)
        ExtraTensorInfo.AddLocation(b, int(extra.location))
        ExtraTensorInfo.AddDeviceType(b, int(extra.device_type))
        ExtraTensorInfo.AddDeviceIndex(b, extra.device_index)
        return int(ExtraTensorInfo.End(b))

