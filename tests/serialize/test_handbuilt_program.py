"""Programs built by hand: written by exirc, run by ExecuTorch, read back.

What ExecuTorch's runtime needs of a program (found by trying, ET 1.5.1):
  * `non_const_buffer_sizes[0]` is reserved and ignored; a tensor with
    `allocation_info.memory_id` i lives in arena i, so the first planned
    arena is id 1 and the list needs at least two entries.
  * Method inputs may be planned (as ExecuTorch plans them) or have no
    `allocation_info` at all; both run.
  * The program must carry a `constant_segment` with at least the reserved
    offset of buffer 0, even with no constants: the runtime is built without
    the old `constant_buffer` path and rejects a program without one.
  * `container_meta_type` is optional.
"""

from __future__ import annotations

import dataclasses
import struct

import pytest
import torch

import exirc.serialize.program as P
from exirc.serialize import deserialize, metadata
from exirc.serialize.writer import serialize
from tests.oracle import (
    assert_same,
    executorch_read,
    load_with_executorch,
    requires_executorch,
    run_with_executorch,
)
from tests.programs import without_metadata_segment

F32 = P.ScalarType.FLOAT
CONSTANT_ALIGNMENT = 16


def _f32(sizes: list[int], **kw: object) -> P.Tensor:
    return P.Tensor(F32, list(sizes), list(range(len(sizes))), **kw)  # type: ignore[arg-type]


def _empty_constant_segment() -> tuple[list[P.DataSegment], P.SubsegmentOffsets]:
    data, offsets = P.pack_subsegments([b""], CONSTANT_ALIGNMENT)
    return [P.DataSegment(data)], P.SubsegmentOffsets(0, offsets)


def add_program(*, plan_inputs: bool = True) -> P.Program:
    """forward(x, y) = aten::add.out(x, y, alpha=1, out=z), float32 [2, 3]."""
    nbytes = 2 * 3 * 4
    slot = 32  # each planned tensor at a 16-aligned offset, as ET plans them

    def planned(i: int) -> P.AllocationDetails:
        return P.AllocationDetails.at(1, i * slot)

    values: list[P.EValue] = [
        _f32([2, 3], allocation_info=planned(0) if plan_inputs else None),  # 0: x
        _f32([2, 3], allocation_info=planned(1) if plan_inputs else None),  # 1: y
        P.Int(1),  # 2: alpha
        _f32([2, 3], allocation_info=planned(2)),  # 3: z
    ]
    assert nbytes <= slot
    segments, constant_segment = _empty_constant_segment()
    plan = P.ExecutionPlan(
        name="forward",
        values=values,
        inputs=[0, 1],
        outputs=[3],
        chains=[P.Chain(inputs=[0, 1], outputs=[3],
                        instructions=[P.KernelCall(op_index=0, args=[0, 1, 2, 3, 3])])],
        operators=[P.Operator("aten::add", "out")],
        non_const_buffer_sizes=[0, 3 * slot],
    )
    return P.Program(execution_plan=[plan], segments=segments, constant_segment=constant_segment)


Y_CONST = torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.25 - 0.5


def add_constant_program() -> P.Program:
    """forward(x) = x + Y_CONST, with Y_CONST in the constant segment."""
    y_bytes = Y_CONST.numpy().tobytes()
    data, offsets = P.pack_subsegments([b"", y_bytes], CONSTANT_ALIGNMENT)
    values: list[P.EValue] = [
        _f32([2, 3], allocation_info=P.AllocationDetails.at(1, 0)),  # 0: x
        _f32([2, 3], data_buffer_idx=1),  # 1: y, a constant
        P.Int(1),  # 2: alpha
        _f32([2, 3], allocation_info=P.AllocationDetails.at(1, 32)),  # 3: z
    ]
    plan = P.ExecutionPlan(
        name="forward",
        values=values,
        inputs=[0],
        outputs=[3],
        chains=[P.Chain(inputs=[0], outputs=[3],
                        instructions=[P.KernelCall(op_index=0, args=[0, 1, 2, 3, 3])])],
        operators=[P.Operator("aten::add", "out")],
        non_const_buffer_sizes=[0, 64],
        container_meta_type=P.ContainerMetadata("inputs-spec", "outputs-spec"),
    )
    return P.Program(
        execution_plan=[plan],
        segments=[P.DataSegment(data)],
        constant_segment=P.SubsegmentOffsets(0, offsets),
    )


def everything_program() -> P.Program:
    """Every value type, instruction kind and optional table, in range."""
    const_i64 = struct.pack("<4q", 1, -2, 3, 1 << 40)
    constants, offsets = P.pack_subsegments([b"", const_i64], CONSTANT_ALIGNMENT)
    big = (1 << 32) + 1024  # an arena past 4 GiB: exercises memory_offset_high
    values: list[P.EValue] = [
        P.Null(),  # 0
        P.Int(-7),  # 1
        P.Bool(True),  # 2
        P.Double(2.5),  # 3
        P.String("héllo, wörld"),  # 4
        P.IntList([1, 19, 14]),  # 5: value indices of Int values (as ET has it)
        P.DoubleList([0.5, -1.25, float("inf"), 1e-300]),  # 6
        P.BoolList([True, False, True]),  # 7
        _f32([2, 3], allocation_info=P.AllocationDetails.at(1, 0)),  # 8
        P.Tensor(  # 9: a constant with extra info
            P.ScalarType.LONG, [4], [0], data_buffer_idx=1, requires_grad=False,
            extra_tensor_info=P.ExtraTensorInfo(
                mutable_data_segments_idx=0, fully_qualified_name="model.table",
                location=P.TensorDataLocation.SEGMENT, device_type=P.DeviceType.CUDA,
                device_index=1,
            ),
        ),
        P.TensorList([8, 13]),  # 10
        P.OptionalTensorList([8, 0, 13, -1]),  # 11: -1 and Null both mean None
        P.Bool(False),  # 12
        P.Tensor(  # 13: half, channels-last-ish dim order, dynamic, planned past 4 GiB
            P.ScalarType.HALF, [3, 2], [1, 0], storage_offset=0, requires_grad=True,
            allocation_info=P.AllocationDetails.at(1, 1 << 32),
            shape_dynamism=P.TensorShapeDynamism.DYNAMIC_BOUND,
            extra_tensor_info=P.ExtraTensorInfo(fully_qualified_name=None),
        ),
        P.Int(0),  # 14
        P.Double(-0.0),  # 15
        P.String(""),  # 16
        P.IntList([]),  # 17
        P.Tensor(P.ScalarType.BOOL, [], [], allocation_info=P.AllocationDetails.at(2, 8)),  # 18
        P.Int(1 << 40),  # 19
        P.Int(-(1 << 63)),  # 20
    ]
    instructions: list[P.Instruction] = [
        P.KernelCall(op_index=0, args=[8, 9, 1, 8, 8]),
        P.DelegateCall(delegate_index=0, args=[8, 13]),
        P.MoveCall(move_from=1, move_to=14),
        P.JumpFalseCall(cond_value_index=12, destination_instruction=5),
        P.FreeCall(value_index=8),
        P.KernelCall(op_index=1, args=[0, 2, 3, 4, 5, 6, 7, 10, 11, 15, 16, 17, 18]),
        P.DelegateCall(delegate_index=1, args=[]),
        P.JumpFalseCall(cond_value_index=12, destination_instruction=8),  # one past the end
    ]
    stacktrace = [
        P.FrameList([P.Frame("model.py", 12, "forward", "y = x + w"),
                     P.Frame("layers.py", 3, "add", None)]),
        P.FrameList([]),
        P.FrameList([P.Frame(None, 0, None, None)]),
        P.FrameList([P.Frame("a.py", 1, "f", "if c:")]),
        P.FrameList([P.Frame("a.py", 2, "f", "del x")]),
        P.FrameList([P.Frame("ünïcode.py", 2**31 - 1, "g", "")]),
        P.FrameList([]),
        P.FrameList([]),
    ]
    forward = P.ExecutionPlan(
        name="forward",
        values=values,
        inputs=[8],
        outputs=[13, 18],
        chains=[
            P.Chain(inputs=[8], outputs=[13], instructions=instructions, stacktrace=stacktrace),
            P.Chain(inputs=[13], outputs=[18],
                    instructions=[P.KernelCall(op_index=1, args=[13, 18])]),
        ],
        operators=[P.Operator("aten::add", "out"), P.Operator("my_ns::custom", "")],
        delegates=[
            P.BackendDelegate(
                "SegmentBackend",
                P.BackendDelegateDataReference(P.DataLocation.SEGMENT, 1),
                [P.CompileSpec("level", b"\x03"), P.CompileSpec("empty", b""),
                 P.CompileSpec("blob", bytes(range(256)))],
            ),
            P.BackendDelegate(
                "InlineBackend", P.BackendDelegateDataReference(P.DataLocation.INLINE, 0)
            ),
        ],
        non_const_buffer_sizes=[0, big, 16],
        non_const_buffer_device=[P.NonConstBufferDevice(1), P.NonConstBufferDevice(
            2, P.DeviceType.CUDA, 3)],
        container_meta_type=P.ContainerMetadata('[1, {"type": "builtins.tuple"}]', "[1]"),
    )
    second = P.ExecutionPlan(
        name="second_method",
        values=[_f32([4], allocation_info=P.AllocationDetails.at(1, 0)),
                _f32([4], allocation_info=P.AllocationDetails.at(1, 16))],
        inputs=[0],
        outputs=[1],
        chains=[P.Chain(inputs=[0], outputs=[1],
                        instructions=[P.KernelCall(op_index=0, args=[0, 1])])],
        operators=[P.Operator("aten::relu", "out")],
        non_const_buffer_sizes=[0, 32],
    )
    return P.Program(
        execution_plan=[forward, second],
        backend_delegate_data=[P.BackendDelegateInlineData(b"inline payload")],
        segments=[
            P.DataSegment(constants),
            P.DataSegment(b"delegate payload in a segment"),
            P.DataSegment(b"named blob"),
            P.DataSegment(bytes(32)),
        ],
        constant_segment=P.SubsegmentOffsets(0, offsets),
        mutable_data_segments=[P.SubsegmentOffsets(3, [0, 16])],
        named_data=[P.NamedData("weights/blob", 2), P.NamedData("", 1)],
    )


def inline_constants_program() -> P.Program:
    """The older layout: constants inside the FlatBuffer (constant_buffer)."""
    program = add_constant_program()
    program.segments = []
    program.constant_segment = None
    program.constant_buffer = [P.Buffer(b""), P.Buffer(Y_CONST.numpy().tobytes())]
    return program


PROGRAMS = {
    "add": add_program,
    "add_unplanned_inputs": lambda: add_program(plan_inputs=False),
    "add_constant": add_constant_program,
    "everything": everything_program,
    "inline_constants": inline_constants_program,
    "empty": P.Program,
}


# --------------------------------------------------------------------------
# Round trips (no ExecuTorch needed).
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_round_trip_reads_back_equal(name: str) -> None:
    program = PROGRAMS[name]()
    assert without_metadata_segment(deserialize(serialize(program))) == program


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_serialize_is_deterministic(name: str) -> None:
    first = serialize(PROGRAMS[name]())
    assert isinstance(first, bytes)
    assert serialize(PROGRAMS[name]()) == first
    # Reading and writing again changes nothing either.
    assert serialize(deserialize(first)) == first


def test_file_identifier_and_reserved_entries() -> None:
    data = serialize(add_constant_program())
    assert data[4:8] == b"ET12"
    read = deserialize(data)
    assert read.constant_count() == 2
    assert bytes(read.constant_data(0)) == b""
    assert bytes(read.constant_data(1))[: Y_CONST.numel() * 4] == Y_CONST.numpy().tobytes()


def test_everything_program_details_survive() -> None:
    # Spot checks that name the fields, beyond the dataclass equality above.
    read = without_metadata_segment(deserialize(serialize(everything_program())))
    forward = read.method("forward")
    assert [type(v).__name__ for v in forward.values[:12]] == [
        "Null", "Int", "Bool", "Double", "String", "IntList", "DoubleList", "BoolList",
        "Tensor", "Tensor", "TensorList", "OptionalTensorList",
    ]
    assert [type(i).__name__ for i in forward.chains[0].instructions[:5]] == [
        "KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall",
    ]
    assert forward.values[5] == P.IntList([1, 19, 14])
    assert [forward.values[i] for i in forward.values[5].items] == [  # type: ignore[union-attr]
        P.Int(-7), P.Int(1 << 40), P.Int(0)]
    assert forward.values[20] == P.Int(-(1 << 63))
    assert forward.values[11] == P.OptionalTensorList([8, 0, 13, -1])
    assert forward.values[6].items[2] == float("inf")  # type: ignore[union-attr]
    half = forward.values[13]
    assert isinstance(half, P.Tensor) and half.allocation_info is not None
    assert half.allocation_info.offset == 1 << 32
    assert half.allocation_info.memory_offset_high == 1
    assert half.dim_order == [1, 0]
    assert half.shape_dynamism == P.TensorShapeDynamism.DYNAMIC_BOUND
    const = forward.values[9]
    assert isinstance(const, P.Tensor) and const.extra_tensor_info is not None
    assert const.extra_tensor_info.fully_qualified_name == "model.table"
    assert const.extra_tensor_info.device_type == P.DeviceType.CUDA
    assert struct.unpack("<4q", bytes(read.constant_data(1))[:32]) == (1, -2, 3, 1 << 40)
    assert forward.chains[0].stacktrace[0].items[1] == P.Frame("layers.py", 3, "add", None)
    assert forward.chains[1].stacktrace == []
    assert forward.delegates[0].compile_specs[2].value == bytes(range(256))
    assert bytes(read.segments[forward.delegates[0].processed.index].data) == (
        b"delegate payload in a segment"
    )
    assert bytes(read.backend_delegate_data[0].data) == b"inline payload"
    assert {n.key: bytes(read.segments[n.segment_index].data) for n in read.named_data} == {
        "weights/blob": b"named blob", "": b"delegate payload in a segment",
    }
    assert forward.non_const_buffer_sizes == [0, (1 << 32) + 1024, 16]
    assert read.method("second_method").operators == [P.Operator("aten::relu", "out")]


# --------------------------------------------------------------------------
# Read by ExecuTorch's Python reader.
# --------------------------------------------------------------------------


def _sub_buffers(program: P.Program, sub: P.SubsegmentOffsets) -> list[bytes]:
    data = bytes(program.segments[sub.segment_index].data)
    ends = [*sub.offsets[1:], len(data)]
    return [data[start:end] for start, end in zip(sub.offsets, ends)]


def assert_executorch_reader_agrees(program: P.Program, data: bytes) -> None:
    """ExecuTorch's own reader finds `program` in `data`.

    Its reader moves segment data back into the program (constants into
    constant_buffer, delegate payloads inline, named and mutable data into
    side stores), so those are compared by content.
    """
    et = executorch_read(data)
    et_program = et.program
    assert et_program.version == program.version
    assert len(et_program.execution_plan) == len(program.execution_plan)
    for plan, et_plan in zip(program.execution_plan, et_program.execution_plan):
        for f in dataclasses.fields(et_plan):
            if f.name != "delegates":
                where = f"{plan.name}.{f.name}"
                assert_same(getattr(plan, f.name), getattr(et_plan, f.name), where)
        assert len(plan.delegates) == len(et_plan.delegates)
        for i, (d, et_d) in enumerate(zip(plan.delegates, et_plan.delegates)):
            where = f"{plan.name}.delegates[{i}]"
            assert d.id == et_d.id, where
            assert_same(d.compile_specs, et_d.compile_specs, f"{where}.compile_specs")
            if d.processed.location == P.DataLocation.INLINE:
                payload = bytes(program.backend_delegate_data[d.processed.index].data)
            else:
                payload = bytes(program.segments[d.processed.index].data)
            assert et_d.processed.location.name == "INLINE", where
            assert bytes(et_program.backend_delegate_data[et_d.processed.index].data) == payload
    ours_constants = [bytes(program.constant_data(i)) for i in range(program.constant_count())]
    assert [bytes(b.storage) for b in et_program.constant_buffer] == ours_constants
    named = {} if et.named_data is None else {
        key: bytes(et.named_data.buffers[entry.buffer_index])
        for key, entry in et.named_data.pte_data.items()
    }
    assert named == {n.key: bytes(program.segments[n.segment_index].data)
                     for n in program.named_data}
    ours_mutable = [buf for sub in program.mutable_data_segments
                    for buf in _sub_buffers(program, sub)]
    assert [bytes(b.storage) for b in et.mutable_data or []] == ours_mutable


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_executorch_reader_reads_handbuilt_programs(name: str) -> None:
    program = PROGRAMS[name]()
    # ET reads the file's form: stack traces in exirc's metadata segment
    assert_executorch_reader_agrees(metadata.merged(program), serialize(program))


# --------------------------------------------------------------------------
# Run by ExecuTorch.
# --------------------------------------------------------------------------


def _checked(program: P.Program) -> bytes:
    """`program`'s bytes, after ET's reader agrees on them: a malformed
    program can crash the runtime (and the test session) instead of failing."""
    data = serialize(program)
    assert_executorch_reader_agrees(program, data)
    return data


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("plan_inputs", [True, False], ids=["planned", "unplanned"])
def test_executorch_runs_handbuilt_add(plan_inputs: bool) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    out = run_with_executorch(_checked(add_program(plan_inputs=plan_inputs)), [x, y])
    assert len(out) == 1
    assert out[0].dtype == torch.float32 and out[0].shape == (2, 3)
    assert torch.equal(out[0], x + y)


@requires_executorch
@pytest.mark.oracle
def test_executorch_runs_handbuilt_add_with_constant() -> None:
    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    out = run_with_executorch(_checked(add_constant_program()), [x])
    assert len(out) == 1
    assert torch.equal(out[0], x + Y_CONST)
    # Twice on one loaded module: planned memory is reused correctly.
    module = load_with_executorch(_checked(add_constant_program()))
    for scale in (1.0, -3.0):
        assert torch.equal(module.forward([x * scale])[0], x * scale + Y_CONST)


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("plan_inputs", [True, False], ids=["planned", "unplanned"])
def test_executorch_sees_handbuilt_method_signature(plan_inputs: bool) -> None:
    module = load_with_executorch(_checked(add_program(plan_inputs=plan_inputs)))
    assert set(module.method_names()) == {"forward"}
    meta = module.method_meta("forward")
    assert meta.name() == "forward"
    assert meta.num_inputs() == 2
    assert meta.num_outputs() == 1
    for i in range(2):
        info = meta.input_tensor_meta(i)
        assert tuple(info.sizes()) == (2, 3)
        assert info.dtype() == int(F32)
        assert info.nbytes() == 24
        # allocation_info is what makes a tensor "memory planned".
        assert info.is_memory_planned() == plan_inputs
    assert meta.output_tensor_meta(0).is_memory_planned()


@requires_executorch
@pytest.mark.oracle
def test_executorch_ignores_reserved_buffer_size_entry() -> None:
    # non_const_buffer_sizes[0] is reserved: whatever it holds, arena 1 is
    # the first one, and a list without arena 1 cannot place memory_id 1.
    x, y = torch.ones(2, 3), torch.full((2, 3), 2.0)
    program = add_program()
    program.execution_plan[0].non_const_buffer_sizes = [1000, 96]
    assert torch.equal(run_with_executorch(_checked(program), [x, y])[0], x + y)
    program.execution_plan[0].non_const_buffer_sizes = [96]
    with pytest.raises(RuntimeError):
        # exirc's reader rejects this too (memory_id 1 out of range), so
        # write it without reading it back.
        run_with_executorch(serialize(program), [x, y])


@requires_executorch
@pytest.mark.oracle
def test_executorch_rejects_program_without_constant_segment() -> None:
    # Documents a runtime requirement the emitter must meet (see the module
    # docstring); if ExecuTorch ever relaxes it, this test tells us.
    program = add_program()
    program.segments = []
    program.constant_segment = None
    data = serialize(program)
    with pytest.raises(RuntimeError):
        load_with_executorch(data).forward([torch.zeros(2, 3), torch.zeros(2, 3)])
