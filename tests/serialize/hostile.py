"""Builders for hostile `.pte` files: valid base programs and crafted traps.

Two halves:

* Base programs (`BASE_PROGRAMS`): `exirc.serialize.program.Program` objects of several
  shapes whose cross-references are all valid, the seeds of the mutation
  tests.
* A raw writer (`RawWriter` / `encode`) that turns a program model into
  `.pte` bytes with `flatbuffers.Builder` and the flatc-generated builder
  functions, *without any validation*, and that records where every table
  and vector landed in the file (`marks`). It writes whatever it is given:
  out-of-range indices, unknown enum values, arbitrary union tags
  (`RawUnion`), so tests can produce files a checked writer refuses. The
  marks let tests patch bytes at exact places (vector lengths, uoffsets,
  soffsets) afterwards.

Independent of `exirc.serialize` on purpose: the reader under test must
not be checked only against its own writer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import flatbuffers

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

FILE_IDENTIFIER = b"ET12"
HEADER_MAGIC = b"eh00"
HEADER_OFFSET = 8
HEADER_LENGTH = 32
SEGMENT_ALIGNMENT = 128
CONSTANT_ALIGNMENT = 16

ST = P.ScalarType


# ==========================================================================
# Byte helpers
# ==========================================================================


def u32(data: bytes, pos: int) -> int:
    return struct.unpack_from("<I", data, pos)[0]


def i32(data: bytes, pos: int) -> int:
    return struct.unpack_from("<i", data, pos)[0]


def u16(data: bytes, pos: int) -> int:
    return struct.unpack_from("<H", data, pos)[0]


def put(data: bytes, pos: int, fmt: str, value: int) -> bytes:
    """A copy of `data` with `value` packed (little-endian `fmt`) at `pos`."""
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, pos, value)
    return bytes(out)


def put_u32(data: bytes, pos: int, value: int) -> bytes:
    return put(data, pos, "I", value & 0xFFFFFFFF)


def put_i32(data: bytes, pos: int, value: int) -> bytes:
    return put(data, pos, "i", value)


def put_u64(data: bytes, pos: int, value: int) -> bytes:
    return put(data, pos, "Q", value)


def field_pos(data: bytes, table_pos: int, slot: int) -> int | None:
    """File position of field number `slot` of the table at `table_pos`.

    None when the vtable does not have the field (it takes its default).
    """
    vtable = table_pos - i32(data, table_pos)
    vtable_size = u16(data, vtable)
    entry = vtable + 4 + 2 * slot
    if entry + 2 > vtable + vtable_size:
        return None
    offset = u16(data, entry)
    return table_pos + offset if offset else None


def parse_header(data: bytes) -> dict[str, int]:
    magic = data[8:12]
    length, program_size, base, size = struct.unpack_from("<IQQQ", data, 12)
    return {"magic": magic, "length": length, "program_size": program_size,
            "segment_base_offset": base, "segment_data_size": size}


def align_up(value: int, alignment: int) -> int:
    return value + (-value % alignment)


def header_bytes(program_size: int, segment_base_offset: int, segment_data_size: int,
                 *, magic: bytes = HEADER_MAGIC, length: int = HEADER_LENGTH) -> bytes:
    return magic + struct.pack("<IQQQ", length, program_size, segment_base_offset,
                               segment_data_size)


def finish_file(builder: flatbuffers.Builder, root: int, segments: list[bytes] = (),
                *, identifier: bytes = FILE_IDENTIFIER,
                segment_alignment: int = SEGMENT_ALIGNMENT) -> tuple[bytes, int]:
    """Finish `builder` at `root`, insert the extended header, append segments.

    Returns the file and the shift (HEADER_LENGTH) to add to builder-relative
    positions `len(flatbuffer) - offset` to get file positions.
    """
    builder.Finish(root, file_identifier=identifier)
    fb = bytes(builder.Output())
    root_offset = u32(fb, 0) + HEADER_LENGTH
    program_size = len(fb) + HEADER_LENGTH
    # No segments: base 0, as ExecuTorch writes it ("no segment data").
    base = align_up(program_size, segment_alignment) if segments else 0
    seg_offsets = segment_layout(segments, segment_alignment)
    seg_size = (seg_offsets[-1] + len(segments[-1])) if segments else 0
    out = bytearray(struct.pack("<I", root_offset) + fb[4:8])
    out += header_bytes(program_size, base, seg_size)
    out += fb[8:]
    for seg, off in zip(segments, seg_offsets, strict=True):
        out += b"\0" * (base + off - len(out))
        out += seg
    return bytes(out), len(fb)


def segment_layout(segments: list[bytes], alignment: int = SEGMENT_ALIGNMENT) -> list[int]:
    offsets, end = [], 0
    for seg in segments:
        start = align_up(end, alignment)
        offsets.append(start)
        end = start + len(seg)
    return offsets


# ==========================================================================
# The raw writer
# ==========================================================================


@dataclass
class RawUnion:
    """A union member written with an arbitrary type tag.

    `body` is a program dataclass (any union member, written as its own
    table) or None (no table: only the tag is written).
    """

    tag: int
    body: Any = None


@dataclass
class Encoded:
    data: bytes
    # Path -> file position, e.g. "execution_plan[0].values" (a vector's
    # length word), "execution_plan[0].values[2]" (the EValue table),
    # "execution_plan[0].values[2].val" (the union member table), "root".
    marks: dict[str, int]

    def at(self, name: str) -> int:
        return self.marks[name]


class RawWriter:
    """Program model -> .pte bytes, unvalidated, recording positions."""

    def __init__(self, segment_alignment: int = SEGMENT_ALIGNMENT) -> None:
        self.b = flatbuffers.Builder(1024)
        self.offsets: dict[str, int] = {}
        self.segment_alignment = segment_alignment

    def _m(self, name: str, off: int) -> int:
        self.offsets[name] = int(off)
        return int(off)

    def _vec(self, name: str, elem: int, items: list, prepend, align: int | None = None) -> int:
        self.b.StartVector(elem, len(items), align or elem)
        for x in reversed(items):
            prepend(x)
        return self._m(name, self.b.EndVector())

    def _ints(self, name: str, items: list[int]) -> int:
        return self._vec(name, 4, list(items), self.b.PrependInt32)

    def _offs(self, name: str, offs: list[int]) -> int:
        return self._vec(name, 4, offs, self.b.PrependUOffsetTRelative)

    def _bytes(self, name: str, data: bytes, align: int = 1) -> int:
        b = self.b
        b.StartVector(1, len(data), align)
        b.head -= len(data)
        b.Bytes[b.head:b.head + len(data)] = bytes(data)
        return self._m(name, b.EndVector())

    def _str(self, name: str, text: str | None) -> int | None:
        if text is None:
            return None
        return self._m(name, self.b.CreateString(text))

    # ---------------------------------------------------------------------

    def encode(self, program: P.Program) -> Encoded:
        b = self.b
        segs = [bytes(s.data) for s in program.segments]
        seg_offsets = segment_layout(segs, self.segment_alignment)
        plans = [self.plan(f"execution_plan[{i}]", p) for i, p in enumerate(program.execution_plan)]
        bufs = []
        for i, buf in enumerate(program.constant_buffer):
            st = self._bytes(f"constant_buffer[{i}].storage", buf.storage, 16)
            Buffer.Start(b)
            Buffer.AddStorage(b, st)
            bufs.append(self._m(f"constant_buffer[{i}]", Buffer.End(b)))
        inline = []
        for i, d in enumerate(program.backend_delegate_data):
            st = self._bytes(f"backend_delegate_data[{i}].data", d.data, 16)
            BackendDelegateInlineData.Start(b)
            BackendDelegateInlineData.AddData(b, st)
            inline.append(self._m(f"backend_delegate_data[{i}]", BackendDelegateInlineData.End(b)))
        seg_tables = []
        for i, (s, off) in enumerate(zip(segs, seg_offsets, strict=True)):
            DataSegment.Start(b)
            DataSegment.AddOffset(b, off)
            DataSegment.AddSize(b, len(s))
            seg_tables.append(self._m(f"segments[{i}]", DataSegment.End(b)))
        cs = None
        if program.constant_segment is not None:
            cs = self.subsegments("constant_segment", program.constant_segment)
        mutable = [self.subsegments(f"mutable_data_segments[{i}]", s)
                   for i, s in enumerate(program.mutable_data_segments)]
        named = []
        for i, nd in enumerate(program.named_data):
            key = self._str(f"named_data[{i}].key", nd.key)
            NamedData.Start(b)
            if key is not None:
                NamedData.AddKey(b, key)
            NamedData.AddSegmentIndex(b, nd.segment_index)
            named.append(self._m(f"named_data[{i}]", NamedData.End(b)))

        plans_v = self._offs("execution_plan", plans)
        bufs_v = self._offs("constant_buffer", bufs)
        inline_v = self._offs("backend_delegate_data", inline)
        segs_v = self._offs("segments", seg_tables)
        mutable_v = self._offs("mutable_data_segments", mutable) if mutable else None
        named_v = self._offs("named_data", named) if named else None
        Program.Start(b)
        Program.AddVersion(b, program.version)
        Program.AddExecutionPlan(b, plans_v)
        Program.AddConstantBuffer(b, bufs_v)
        Program.AddBackendDelegateData(b, inline_v)
        Program.AddSegments(b, segs_v)
        if cs is not None:
            Program.AddConstantSegment(b, cs)
        if mutable_v is not None:
            Program.AddMutableDataSegments(b, mutable_v)
        if named_v is not None:
            Program.AddNamedData(b, named_v)
        root = self._m("root", Program.End(b))
        data, fb_len = finish_file(b, root, segs, segment_alignment=self.segment_alignment)
        marks = {k: fb_len - off + HEADER_LENGTH for k, off in self.offsets.items()}
        return Encoded(data, marks)

    def subsegments(self, name: str, sub: P.SubsegmentOffsets) -> int:
        b = self.b
        offs = self._vec(f"{name}.offsets", 8, list(sub.offsets), b.PrependUint64)
        SubsegmentOffsets.Start(b)
        SubsegmentOffsets.AddSegmentIndex(b, sub.segment_index)
        SubsegmentOffsets.AddOffsets(b, offs)
        return self._m(name, SubsegmentOffsets.End(b))

    def plan(self, name: str, plan: P.ExecutionPlan) -> int:
        b = self.b
        pname = self._str(f"{name}.name", plan.name)
        meta = None
        if plan.container_meta_type is not None:
            cm = plan.container_meta_type
            i = self._str(f"{name}.container_meta_type.encoded_inp_str", cm.encoded_inp_str)
            o = self._str(f"{name}.container_meta_type.encoded_out_str", cm.encoded_out_str)
            ContainerMetadata.Start(b)
            if i is not None:
                ContainerMetadata.AddEncodedInpStr(b, i)
            if o is not None:
                ContainerMetadata.AddEncodedOutStr(b, o)
            meta = self._m(f"{name}.container_meta_type", ContainerMetadata.End(b))
        values = self._offs(f"{name}.values", [self.evalue(f"{name}.values[{i}]", v)
                                              for i, v in enumerate(plan.values)])
        inputs = self._ints(f"{name}.inputs", plan.inputs)
        outputs = self._ints(f"{name}.outputs", plan.outputs)
        chains = self._offs(f"{name}.chains", [self.chain(f"{name}.chains[{i}]", c)
                                              for i, c in enumerate(plan.chains)])
        ops = []
        for i, op in enumerate(plan.operators):
            n = self._str(f"{name}.operators[{i}].name", op.name)
            o = self._str(f"{name}.operators[{i}].overload", op.overload)
            Operator.Start(b)
            if n is not None:
                Operator.AddName(b, n)
            if o is not None:
                Operator.AddOverload(b, o)
            ops.append(self._m(f"{name}.operators[{i}]", Operator.End(b)))
        ops_v = self._offs(f"{name}.operators", ops)
        dels = [self.delegate(f"{name}.delegates[{i}]", d) for i, d in enumerate(plan.delegates)]
        dels_v = self._offs(f"{name}.delegates", dels)
        sizes = self._vec(f"{name}.non_const_buffer_sizes", 8, list(plan.non_const_buffer_sizes),
                          b.PrependInt64)
        devs_v = None
        if plan.non_const_buffer_device:
            devs = []
            for i, d in enumerate(plan.non_const_buffer_device):
                NonConstBufferDevice.Start(b)
                NonConstBufferDevice.AddBufferIdx(b, d.buffer_idx)
                NonConstBufferDevice.AddDeviceType(b, int(d.device_type))
                NonConstBufferDevice.AddDeviceIndex(b, d.device_index)
                devs.append(self._m(f"{name}.non_const_buffer_device[{i}]",
                                    NonConstBufferDevice.End(b)))
            devs_v = self._offs(f"{name}.non_const_buffer_device", devs)
        ExecutionPlan.Start(b)
        if pname is not None:
            ExecutionPlan.AddName(b, pname)
        if meta is not None:
            ExecutionPlan.AddContainerMetaType(b, meta)
        ExecutionPlan.AddValues(b, values)
        ExecutionPlan.AddInputs(b, inputs)
        ExecutionPlan.AddOutputs(b, outputs)
        ExecutionPlan.AddChains(b, chains)
        ExecutionPlan.AddOperators(b, ops_v)
        ExecutionPlan.AddDelegates(b, dels_v)
        ExecutionPlan.AddNonConstBufferSizes(b, sizes)
        if devs_v is not None:
            ExecutionPlan.AddNonConstBufferDevice(b, devs_v)
        return self._m(name, ExecutionPlan.End(b))

    def delegate(self, name: str, d: P.BackendDelegate) -> int:
        b = self.b
        ident = self._str(f"{name}.id", d.id)
        BackendDelegateDataReference.Start(b)
        BackendDelegateDataReference.AddLocation(b, int(d.processed.location))
        BackendDelegateDataReference.AddIndex(b, d.processed.index)
        processed = self._m(f"{name}.processed", BackendDelegateDataReference.End(b))
        specs = []
        for i, spec in enumerate(d.compile_specs):
            k = self._str(f"{name}.compile_specs[{i}].key", spec.key)
            v = self._bytes(f"{name}.compile_specs[{i}].value", spec.value)
            CompileSpec.Start(b)
            if k is not None:
                CompileSpec.AddKey(b, k)
            CompileSpec.AddValue(b, v)
            specs.append(self._m(f"{name}.compile_specs[{i}]", CompileSpec.End(b)))
        specs_v = self._offs(f"{name}.compile_specs", specs)
        BackendDelegate.Start(b)
        if ident is not None:
            BackendDelegate.AddId(b, ident)
        BackendDelegate.AddProcessed(b, processed)
        BackendDelegate.AddCompileSpecs(b, specs_v)
        return self._m(name, BackendDelegate.End(b))

    def chain(self, name: str, chain: P.Chain) -> int:
        b = self.b
        inputs = self._ints(f"{name}.inputs", chain.inputs)
        outputs = self._ints(f"{name}.outputs", chain.outputs)
        instrs = self._offs(f"{name}.instructions",
                            [self.instruction(f"{name}.instructions[{i}]", x)
                             for i, x in enumerate(chain.instructions)])
        st = None
        if chain.stacktrace:
            st = self._offs(f"{name}.stacktrace",
                            [self.frame_list(f"{name}.stacktrace[{i}]", f)
                             for i, f in enumerate(chain.stacktrace)])
        Chain.Start(b)
        Chain.AddInputs(b, inputs)
        Chain.AddOutputs(b, outputs)
        Chain.AddInstructions(b, instrs)
        if st is not None:
            Chain.AddStacktrace(b, st)
        return self._m(name, Chain.End(b))

    def frame_list(self, name: str, frames: P.FrameList) -> int:
        b = self.b
        items = []
        for i, f in enumerate(frames.items):
            fn = self._str(f"{name}.items[{i}].filename", f.filename)
            nm = self._str(f"{name}.items[{i}].name", f.name)
            cx = self._str(f"{name}.items[{i}].context", f.context)
            Frame.Start(b)
            if fn is not None:
                Frame.AddFilename(b, fn)
            Frame.AddLineno(b, f.lineno)
            if nm is not None:
                Frame.AddName(b, nm)
            if cx is not None:
                Frame.AddContext(b, cx)
            items.append(self._m(f"{name}.items[{i}]", Frame.End(b)))
        v = self._offs(f"{name}.items", items)
        FrameList.Start(b)
        FrameList.AddItems(b, v)
        return self._m(name, FrameList.End(b))

    def instruction(self, name: str, instr: Any) -> int:
        b = self.b
        if isinstance(instr, RawUnion):
            tag, body = instr.tag, instr.body
        else:
            tag, body = P.INSTRUCTION_TYPES.index(type(instr)) + 1, instr
        body_off = None if body is None else self.instruction_body(f"{name}.instr_args", body)
        Instruction.Start(b)
        Instruction.AddInstrArgsType(b, tag)
        if body_off is not None:
            Instruction.AddInstrArgs(b, body_off)
        return self._m(name, Instruction.End(b))

    def instruction_body(self, name: str, instr: Any) -> int:
        b = self.b
        if isinstance(instr, P.KernelCall):
            args = self._ints(f"{name}.args", instr.args)
            KernelCall.Start(b)
            KernelCall.AddOpIndex(b, instr.op_index)
            KernelCall.AddArgs(b, args)
            return self._m(name, KernelCall.End(b))
        if isinstance(instr, P.DelegateCall):
            args = self._ints(f"{name}.args", instr.args)
            DelegateCall.Start(b)
            DelegateCall.AddDelegateIndex(b, instr.delegate_index)
            DelegateCall.AddArgs(b, args)
            return self._m(name, DelegateCall.End(b))
        if isinstance(instr, P.MoveCall):
            MoveCall.Start(b)
            MoveCall.AddMoveFrom(b, instr.move_from)
            MoveCall.AddMoveTo(b, instr.move_to)
            return self._m(name, MoveCall.End(b))
        if isinstance(instr, P.JumpFalseCall):
            JumpFalseCall.Start(b)
            JumpFalseCall.AddCondValueIndex(b, instr.cond_value_index)
            JumpFalseCall.AddDestinationInstruction(b, instr.destination_instruction)
            return self._m(name, JumpFalseCall.End(b))
        if isinstance(instr, P.FreeCall):
            FreeCall.Start(b)
            FreeCall.AddValueIndex(b, instr.value_index)
            return self._m(name, FreeCall.End(b))
        if isinstance(instr, P.KERNEL_TYPES):
            # A value table where an instruction is expected (tag confusion).
            return self.value_body(name, instr)
        raise TypeError(f"cannot write {instr!r} as an instruction")

    def evalue(self, name: str, value: Any) -> int:
        b = self.b
        if isinstance(value, RawUnion):
            tag, body = value.tag, value.body
        else:
            tag, body = P.KERNEL_TYPES.index(type(value)) + 1, value
        body_off = None if body is None else self.value_body(f"{name}.val", body)
        EValue.Start(b)
        EValue.AddValType(b, tag)
        if body_off is not None:
            EValue.AddVal(b, body_off)
        return self._m(name, EValue.End(b))

    def value_body(self, name: str, v: Any) -> int:
        b = self.b
        if isinstance(v, P.Tensor):
            return self.tensor(name, v)
        if isinstance(v, P.Null):
            Null.Start(b)
            return self._m(name, Null.End(b))
        if isinstance(v, P.Int):
            Int.Start(b)
            Int.AddIntVal(b, v.int_val)
            return self._m(name, Int.End(b))
        if isinstance(v, P.Bool):
            Bool.Start(b)
            Bool.AddBoolVal(b, v.bool_val)
            return self._m(name, Bool.End(b))
        if isinstance(v, P.Double):
            Double.Start(b)
            Double.AddDoubleVal(b, v.double_val)
            return self._m(name, Double.End(b))
        if isinstance(v, P.String):
            s = self._str(f"{name}.string_val", v.string_val)
            String.Start(b)
            if s is not None:
                String.AddStringVal(b, s)
            return self._m(name, String.End(b))
        if isinstance(v, P.IntList):
            it = self._vec(f"{name}.items", 8, list(v.items), b.PrependInt64)
            IntList.Start(b)
            IntList.AddItems(b, it)
            return self._m(name, IntList.End(b))
        if isinstance(v, P.DoubleList):
            it = self._vec(f"{name}.items", 8, list(v.items), b.PrependFloat64)
            DoubleList.Start(b)
            DoubleList.AddItems(b, it)
            return self._m(name, DoubleList.End(b))
        if isinstance(v, P.BoolList):
            it = self._vec(f"{name}.items", 1, list(v.items), b.PrependBool)
            BoolList.Start(b)
            BoolList.AddItems(b, it)
            return self._m(name, BoolList.End(b))
        if isinstance(v, P.TensorList):
            it = self._ints(f"{name}.items", v.items)
            TensorList.Start(b)
            TensorList.AddItems(b, it)
            return self._m(name, TensorList.End(b))
        if isinstance(v, P.OptionalTensorList):
            it = self._ints(f"{name}.items", v.items)
            OptionalTensorList.Start(b)
            OptionalTensorList.AddItems(b, it)
            return self._m(name, OptionalTensorList.End(b))
        if isinstance(v, P.INSTRUCTION_TYPES):
            # An instruction table where a value is expected (tag confusion).
            return self.instruction_body(name, v)
        raise TypeError(f"cannot write {v!r} as a value")

    def tensor(self, name: str, t: P.Tensor) -> int:
        b = self.b
        sizes = self._ints(f"{name}.sizes", t.sizes)
        dim_order = self._vec(f"{name}.dim_order", 1, list(t.dim_order), b.PrependUint8)
        alloc = None
        if t.allocation_info is not None:
            a = t.allocation_info
            AllocationDetails.Start(b)
            AllocationDetails.AddMemoryId(b, a.memory_id)
            AllocationDetails.AddMemoryOffsetLow(b, a.memory_offset_low)
            AllocationDetails.AddMemoryOffsetHigh(b, a.memory_offset_high)
            alloc = self._m(f"{name}.allocation_info", AllocationDetails.End(b))
        extra = None
        if t.extra_tensor_info is not None:
            e = t.extra_tensor_info
            fq = self._str(f"{name}.extra_tensor_info.fully_qualified_name",
                           e.fully_qualified_name)
            ExtraTensorInfo.Start(b)
            ExtraTensorInfo.AddMutableDataSegmentsIdx(b, e.mutable_data_segments_idx)
            if fq is not None:
                ExtraTensorInfo.AddFullyQualifiedName(b, fq)
            ExtraTensorInfo.AddLocation(b, int(e.location))
            ExtraTensorInfo.AddDeviceType(b, int(e.device_type))
            ExtraTensorInfo.AddDeviceIndex(b, e.device_index)
            extra = self._m(f"{name}.extra_tensor_info", ExtraTensorInfo.End(b))
        Tensor.Start(b)
        Tensor.AddScalarType(b, int(t.scalar_type))
        Tensor.AddStorageOffset(b, t.storage_offset)
        Tensor.AddSizes(b, sizes)
        Tensor.AddDimOrder(b, dim_order)
        Tensor.AddRequiresGrad(b, t.requires_grad)
        Tensor.AddDataBufferIdx(b, t.data_buffer_idx)
        if alloc is not None:
            Tensor.AddAllocationInfo(b, alloc)
        Tensor.AddLayout(b, t.layout)
        Tensor.AddShapeDynamism(b, int(t.shape_dynamism))
        if extra is not None:
            Tensor.AddExtraTensorInfo(b, extra)
        return self._m(name, Tensor.End(b))


def encode(program: P.Program) -> Encoded:
    """Write `program` (which may be invalid) to .pte bytes, with marks."""
    return RawWriter().encode(program)


# ==========================================================================
# Valid base programs
# ==========================================================================


def _f32(*xs: float) -> bytes:
    return struct.pack(f"<{len(xs)}f", *xs)


def _planned(st: ST, sizes: list[int], offset: int, memory_id: int = 1, **kw: Any) -> P.Tensor:
    return P.Tensor(st, list(sizes), list(range(len(sizes))),
                    allocation_info=P.AllocationDetails.at(memory_id, offset), **kw)


def _constant(st: ST, sizes: list[int], idx: int, **kw: Any) -> P.Tensor:
    return P.Tensor(st, list(sizes), list(range(len(sizes))), data_buffer_idx=idx, **kw)


def constants_in_segment() -> P.Program:
    """One method, add+mul with two constants stored in a constant segment."""
    weight = _f32(1, 2, 3, 4, 5, 6)
    bias = _f32(0.5, -0.5, 0.25)
    seg, offsets = P.pack_subsegments([b"", weight, bias], CONSTANT_ALIGNMENT)
    values = [
        _planned(ST.FLOAT, [2, 3], 0),        # 0 input x
        _constant(ST.FLOAT, [2, 3], 1),       # 1 weight
        _constant(ST.FLOAT, [3], 2),          # 2 bias
        P.Int(1),                             # 3 alpha
        _planned(ST.FLOAT, [2, 3], 32),       # 4 tmp
        _planned(ST.FLOAT, [2, 3], 64),       # 5 out
    ]
    plan = P.ExecutionPlan(
        name="forward",
        values=values,
        inputs=[0],
        outputs=[5],
        chains=[P.Chain(inputs=[0], outputs=[5], instructions=[
            P.KernelCall(0, [0, 1, 3, 4]),
            P.KernelCall(1, [4, 2, 5]),
        ])],
        operators=[P.Operator("aten::add", "out"), P.Operator("aten::mul", "out")],
        non_const_buffer_sizes=[0, 96],
        container_meta_type=P.ContainerMetadata("in-spec", "out-spec"),
    )
    return P.Program(
        execution_plan=[plan],
        segments=[P.DataSegment(seg)],
        constant_segment=P.SubsegmentOffsets(0, offsets),
    )


def two_plans() -> P.Program:
    """Two methods; constants inline in constant_buffer; jump/move/free."""
    forward = P.ExecutionPlan(
        name="forward",
        values=[
            _constant(ST.INT, [4], 1),        # 0 constant
            _planned(ST.INT, [4], 0),         # 1 input
            _planned(ST.INT, [4], 16),        # 2 output
            P.Bool(True),                     # 3 condition
            P.Int(1),                         # 4 alpha
            _planned(ST.INT, [4], 32),        # 5 scratch
        ],
        inputs=[1],
        outputs=[2],
        chains=[P.Chain(inputs=[1], outputs=[2], instructions=[
            P.JumpFalseCall(3, 2),
            P.KernelCall(0, [1, 0, 4, 5]),
            P.MoveCall(5, 2),
            P.FreeCall(5),
        ])],
        operators=[P.Operator("aten::add", "out")],
        non_const_buffer_sizes=[0, 48],
        container_meta_type=P.ContainerMetadata("[1, {}]", "[1]"),
    )
    reset = P.ExecutionPlan(
        name="reset",
        values=[
            P.Tensor(ST.FLOAT, [2, 2], [1, 0], allocation_info=P.AllocationDetails.at(1, 0)),
            P.Double(0.0),
        ],
        inputs=[0],
        outputs=[0],
        chains=[P.Chain(inputs=[0], outputs=[0], instructions=[P.KernelCall(0, [0, 1, 0])])],
        operators=[P.Operator("aten::fill", "Scalar_out")],
        non_const_buffer_sizes=[0, 16],
    )
    return P.Program(
        execution_plan=[forward, reset],
        constant_buffer=[P.Buffer(b""), P.Buffer(struct.pack("<4i", 1, 2, 3, 4))],
    )


def every_value() -> P.Program:
    """Every KernelTypes member, two chains, stacktraces, buffer devices."""
    values = [
        P.Null(),                                                    # 0
        P.Int(-7),                                                   # 1
        P.Bool(False),                                               # 2
        P.Double(2.5),                                               # 3
        _planned(ST.FLOAT, [2, 2], 0, extra_tensor_info=P.ExtraTensorInfo(
            fully_qualified_name="model.x")),                        # 4
        _planned(ST.HALF, [3], 16,
                 shape_dynamism=P.TensorShapeDynamism.DYNAMIC_BOUND),  # 5
        P.String("hello"),                                           # 6
        P.IntList([1, 1]),                                           # 7 (Int indices)
        P.DoubleList([0.5, -1.25]),                                  # 8
        P.BoolList([True, False, True]),                             # 9
        P.TensorList([4, 5]),                                        # 10
        P.OptionalTensorList([4, 0]),                                # 11
        _planned(ST.LONG, [2], 32),                                  # 12 out
        _planned(ST.BOOL, [1, 2, 2], 48, requires_grad=True),        # 13
    ]
    frames = P.FrameList([
        P.Frame("model.py", 10, "forward", "return my_op(x)"),
        P.Frame("lib/ops.py", 3, "my_op", "return torch.ops.my.op(x)"),
    ])
    chain0 = P.Chain(inputs=[4], outputs=[12], instructions=[
        P.KernelCall(0, list(range(13))),
        P.KernelCall(1, [13, 12]),
    ], stacktrace=[frames, P.FrameList([P.Frame("model.py", 11, "forward", "y = z")])])
    chain1 = P.Chain(inputs=[12], outputs=[12], instructions=[
        P.MoveCall(12, 12),
        P.FreeCall(13),
    ], stacktrace=[P.FrameList([]), P.FrameList([P.Frame("m.py", 1, "f", "del t")])])
    plan = P.ExecutionPlan(
        name="forward",
        values=values,
        inputs=[4],
        outputs=[12],
        chains=[chain0, chain1],
        operators=[P.Operator("my::op", "out"), P.Operator("aten::sum", "IntList_out")],
        non_const_buffer_sizes=[0, 64],
        non_const_buffer_device=[P.NonConstBufferDevice(1, P.DeviceType.CPU, 0)],
        container_meta_type=P.ContainerMetadata("", ""),
    )
    return P.Program(execution_plan=[plan])


def delegates() -> P.Program:
    """Delegates with payloads in a segment and inline; named data."""
    blob = bytes(range(256)) * 2
    named_blob = b"NAMED" * 13
    mutable_init = _f32(0, 0, 0, 0)
    plan = P.ExecutionPlan(
        name="forward",
        values=[
            _planned(ST.FLOAT, [4], 0),
            _planned(ST.FLOAT, [4], 16),
            _planned(ST.FLOAT, [4], 32),
        ],
        inputs=[0],
        outputs=[2],
        chains=[P.Chain(inputs=[0], outputs=[2], instructions=[
            P.DelegateCall(0, [0, 1]),
            P.DelegateCall(1, [1, 2]),
        ])],
        delegates=[
            P.BackendDelegate("XnnpackBackend",
                              P.BackendDelegateDataReference(P.DataLocation.SEGMENT, 0),
                              [P.CompileSpec("threads", b"\x04"),
                               P.CompileSpec("mode", b"fast")]),
            P.BackendDelegate("InlineBackend",
                              P.BackendDelegateDataReference(P.DataLocation.INLINE, 0)),
        ],
        non_const_buffer_sizes=[0, 48],
    )
    return P.Program(
        execution_plan=[plan],
        backend_delegate_data=[P.BackendDelegateInlineData(b"inline-payload" * 3)],
        segments=[P.DataSegment(blob), P.DataSegment(named_blob),
                  P.DataSegment(mutable_init)],
        mutable_data_segments=[P.SubsegmentOffsets(2, [0, 0])],
        named_data=[P.NamedData("weights.blob", 1)],
    )


def lists_and_constants() -> P.Program:
    """TensorList of constants (segment), cat into a planned output."""
    a = _f32(1, 2)
    c = _f32(3, 4, 5)
    seg, offsets = P.pack_subsegments([b"", a, c], CONSTANT_ALIGNMENT)
    plan = P.ExecutionPlan(
        name="cat",
        values=[
            _constant(ST.FLOAT, [2], 1),
            _constant(ST.FLOAT, [3], 2),
            P.TensorList([0, 1]),
            P.Int(0),
            _planned(ST.FLOAT, [5], 0),
        ],
        inputs=[],
        outputs=[4],
        chains=[P.Chain(outputs=[4], instructions=[P.KernelCall(0, [2, 3, 4])])],
        operators=[P.Operator("aten::cat", "out")],
        non_const_buffer_sizes=[0, 32],
    )
    return P.Program(
        execution_plan=[plan],
        segments=[P.DataSegment(seg)],
        constant_segment=P.SubsegmentOffsets(0, offsets),
    )


def minimal() -> P.Program:
    """The smallest meaningful program: one method returning an Int."""
    plan = P.ExecutionPlan(name="forward", values=[P.Int(42)], inputs=[], outputs=[0],
                           chains=[], non_const_buffer_sizes=[0])
    return P.Program(execution_plan=[plan])


BASE_PROGRAMS = {
    "constants_in_segment": constants_in_segment,
    "two_plans": two_plans,
    "every_value": every_value,
    "delegates": delegates,
    "lists_and_constants": lists_and_constants,
    "minimal": minimal,
}


def with_plan(program: P.Program, **changes: Any) -> P.Program:
    """`program` with fields of its first execution plan replaced."""
    import dataclasses

    plan = dataclasses.replace(program.execution_plan[0], **changes)
    return dataclasses.replace(program, execution_plan=[plan, *program.execution_plan[1:]])


# ==========================================================================
# Crafted files a normal writer could not produce
# ==========================================================================


def tiny_program_with_vector_length(length: int, slot: str = "execution_plan") -> bytes:
    """A ~80-byte file: Program with one empty vector whose length is `length`."""
    enc = encode(P.Program())
    return put_u32(enc.data, enc.at(slot), length)


def _shared_int_evalue(b: flatbuffers.Builder, value: int = 0) -> int:
    Int.Start(b)
    Int.AddIntVal(b, value)
    body = Int.End(b)
    EValue.Start(b)
    EValue.AddValType(b, P.KERNEL_TYPES.index(P.Int) + 1)
    EValue.AddVal(b, body)
    return EValue.End(b)


def _repeat_offsets(b: flatbuffers.Builder, target: int, count: int) -> int:
    b.StartVector(4, count, 4)
    for _ in range(count):
        b.PrependUOffsetTRelative(target)
    return b.EndVector()


def dag_bomb_plan(n: int = 340) -> bytes:
    """One method whose tables are shared n times at every level.

    values: n entries -> one EValue; chains: n entries -> one Chain whose
    instructions are n entries -> one Instruction (a KernelCall with n args
    = 0) and whose stacktrace is n entries -> one FrameList of n entries ->
    one Frame. Unshared, that is n**3 args and n**3 frames; the file is a
    few KiB.
    """
    b = flatbuffers.Builder(1024)
    name = b.CreateString("forward")
    opname = b.CreateString("aten::add")
    fname = b.CreateString("f.py")
    Frame.Start(b)
    Frame.AddFilename(b, fname)
    Frame.AddLineno(b, 1)
    frame = Frame.End(b)
    frames_v = _repeat_offsets(b, frame, n)
    FrameList.Start(b)
    FrameList.AddItems(b, frames_v)
    frame_list = FrameList.End(b)
    b.StartVector(4, n, 4)
    for _ in range(n):
        b.PrependInt32(0)
    args = b.EndVector()
    KernelCall.Start(b)
    KernelCall.AddOpIndex(b, 0)
    KernelCall.AddArgs(b, args)
    kc = KernelCall.End(b)
    Instruction.Start(b)
    Instruction.AddInstrArgsType(b, 1)
    Instruction.AddInstrArgs(b, kc)
    instr = Instruction.End(b)
    instrs_v = _repeat_offsets(b, instr, n)
    st_v = _repeat_offsets(b, frame_list, n)
    Chain.Start(b)
    Chain.AddInstructions(b, instrs_v)
    Chain.AddStacktrace(b, st_v)
    chain = Chain.End(b)
    chains_v = _repeat_offsets(b, chain, n)
    ev = _shared_int_evalue(b)
    values_v = _repeat_offsets(b, ev, n)
    Operator.Start(b)
    Operator.AddName(b, opname)
    op = Operator.End(b)
    ops_v = _repeat_offsets(b, op, 1)
    b.StartVector(8, 1, 8)
    b.PrependInt64(0)
    sizes = b.EndVector()
    ExecutionPlan.Start(b)
    ExecutionPlan.AddName(b, name)
    ExecutionPlan.AddValues(b, values_v)
    ExecutionPlan.AddChains(b, chains_v)
    ExecutionPlan.AddOperators(b, ops_v)
    ExecutionPlan.AddNonConstBufferSizes(b, sizes)
    plan = ExecutionPlan.End(b)
    plans_v = _repeat_offsets(b, plan, 1)
    Program.Start(b)
    Program.AddExecutionPlan(b, plans_v)
    root = Program.End(b)
    return finish_file(b, root)[0]


def dag_bomb_program(n: int = 340) -> bytes:
    """Program.execution_plan: n entries -> one plan; values n -> one EValue
    (an IntList of n items); chains n -> one Chain; instructions n -> one
    Instruction with n args. Unshared that is n**4 ints in ~8 KiB."""
    b = flatbuffers.Builder(1024)
    name = b.CreateString("forward")
    opname = b.CreateString("aten::add")
    b.StartVector(8, n, 8)
    for _ in range(n):
        b.PrependInt64(7)
    items = b.EndVector()
    IntList.Start(b)
    IntList.AddItems(b, items)
    il = IntList.End(b)
    EValue.Start(b)
    EValue.AddValType(b, P.KERNEL_TYPES.index(P.IntList) + 1)
    EValue.AddVal(b, il)
    ev = EValue.End(b)
    values_v = _repeat_offsets(b, ev, n)
    b.StartVector(4, n, 4)
    for _ in range(n):
        b.PrependInt32(0)
    args = b.EndVector()
    KernelCall.Start(b)
    KernelCall.AddOpIndex(b, 0)
    KernelCall.AddArgs(b, args)
    kc = KernelCall.End(b)
    Instruction.Start(b)
    Instruction.AddInstrArgsType(b, 1)
    Instruction.AddInstrArgs(b, kc)
    instr = Instruction.End(b)
    instrs_v = _repeat_offsets(b, instr, n)
    Chain.Start(b)
    Chain.AddInstructions(b, instrs_v)
    chain = Chain.End(b)
    chains_v = _repeat_offsets(b, chain, n)
    Operator.Start(b)
    Operator.AddName(b, opname)
    op = Operator.End(b)
    ops_v = _repeat_offsets(b, op, 1)
    ExecutionPlan.Start(b)
    ExecutionPlan.AddName(b, name)
    ExecutionPlan.AddValues(b, values_v)
    ExecutionPlan.AddChains(b, chains_v)
    ExecutionPlan.AddOperators(b, ops_v)
    plan = ExecutionPlan.End(b)
    plans_v = _repeat_offsets(b, plan, n)
    Program.Start(b)
    Program.AddExecutionPlan(b, plans_v)
    root = Program.End(b)
    return finish_file(b, root)[0]


def self_referencing_vector_entry() -> bytes:
    """minimal() with execution_plan[0]'s uoffset replaced by 0xFFFFFFFC.

    Read unsigned, it points past the end; read signed (-4), it points at
    the vector's length word: a reader that accepts it walks backwards.
    """
    enc = encode(minimal())
    vec = enc.at("execution_plan")
    return put_u32(enc.data, vec + 4, 0xFFFFFFFC)
