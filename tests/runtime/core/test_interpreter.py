"""The interpreter on hand-built programs: every instruction kind, loading, errors.

The programs are small enough that their right answers are known by hand.
The builders here are shared with the other runtime tests.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import numpy
import pytest
import torch

from exirc.errors import FormatError, ResourceError, UnsupportedOperatorError
from exirc.runtime import load
from exirc.runtime.delegates.registry import BackendRegistry
from exirc.runtime.errors import ExecutionError, StepLimitError
from exirc.runtime.kernels.registry import KERNELS, KernelRegistry
from exirc.serialize import program as P
from exirc.serialize.program import CONSTANT_ALIGNMENT
from exirc.serialize.writer import serialize
from tests.programs import add_constant_program, control_flow_program, index_out_of_range_program

F32 = P.ScalarType.FLOAT


# ---------------------------------------------------------------------------
# Builders.
# ---------------------------------------------------------------------------


def planned(offset: int, sizes: list[int], scalar_type: P.ScalarType = F32,
            dynamic: bool = False) -> P.Tensor:
    dynamism = P.TensorShapeDynamism.DYNAMIC_BOUND if dynamic else P.TensorShapeDynamism.STATIC
    return P.Tensor(scalar_type, sizes, list(range(len(sizes))),
                    allocation_info=P.AllocationDetails.at(1, offset), shape_dynamism=dynamism)


def constant(index: int, sizes: list[int]) -> P.Tensor:
    return P.Tensor(F32, sizes, list(range(len(sizes))), data_buffer_idx=index)


def build(values: list[P.EValue], instructions: list[P.Instruction], operators: list[str],
          inputs: list[int], outputs: list[int], *, arena: int = 256,
          constants: list[list[float]] = (), delegates: list[P.BackendDelegate] = (),
          stacktrace: list[P.FrameList] | None = None) -> P.Program:
    """A one-method program: `operators` are "ns::name.overload" strings."""
    ops = [P.Operator(*name.rsplit(".", 1)) for name in operators]
    chain = P.Chain(instructions=instructions, stacktrace=stacktrace or [])
    plan = P.ExecutionPlan(name="forward", values=values, inputs=inputs, outputs=outputs,
                           chains=[chain], operators=ops, delegates=list(delegates),
                           non_const_buffer_sizes=[0, arena])
    blobs = [b""] + [struct.pack(f"<{len(c)}f", *c) for c in constants]
    segment, offsets = P.pack_subsegments(blobs, CONSTANT_ALIGNMENT)
    return P.Program(execution_plan=[plan], segments=[P.DataSegment(segment)],
                     constant_segment=P.SubsegmentOffsets(0, offsets))


def loop_program() -> P.Program:
    """forward(x: f32[2], n: int) = n * x, by adding x to an accumulator n times.

    Uses a backward JumpFalseCall, a MoveCall of a tensor, and prim ops that
    write a loop counter and a condition at run time.
    """
    values: list[P.EValue] = [
        planned(0, [2]),  # %0 x
        planned(16, [2]),  # %1 acc (output)
        planned(32, [2]),  # %2 tmp
        P.Int(0),  # %3 i
        P.Int(0),  # %4 n (input)
        P.Int(1),  # %5 one
        P.Bool(False),  # %6 done
        P.Int(1),  # %7 alpha
        P.Double(0.0),  # %8 zero
    ]
    instructions: list[P.Instruction] = [
        P.KernelCall(0, [0, 8, 1, 1]),  # 0: acc = x * 0
        P.KernelCall(1, [1, 0, 7, 2, 2]),  # 1: tmp = acc + x
        P.MoveCall(2, 1),  # 2: acc = tmp
        P.KernelCall(2, [3, 5, 3]),  # 3: i = i + 1
        P.KernelCall(3, [3, 4, 6]),  # 4: done = i == n
        P.JumpFalseCall(6, 1),  # 5: loop back to 1 until done
        P.KernelCall(4, [3, 3, 3]),  # 6: i = i - i (the program resets its counter)
    ]
    return build(values, instructions, ["aten::mul.Scalar_out", "aten::add.out",
                                        "executorch_prim::add.Scalar", "executorch_prim::eq.Scalar",
                                        "executorch_prim::sub.Scalar"],
                 inputs=[0, 4], outputs=[1])


def write(tmp_path: Path, program: P.Program, name: str = "p.pte") -> Path:
    path = tmp_path / name
    path.write_bytes(serialize(program))
    return path


# ---------------------------------------------------------------------------
# Running.
# ---------------------------------------------------------------------------


@pytest.mark.smoke
def test_kernel_call_with_constant(tmp_path: Path) -> None:
    program = load(write(tmp_path, add_constant_program()))
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    (out,) = program.run("forward", [x])
    expected = x + torch.tensor([[0.5, -1.0, 2.0], [3.5, 0.0, -0.25]])
    assert torch.equal(out, expected)


def test_loop_with_jumps_moves_and_prim_ops() -> None:
    program = load(serialize(loop_program()))
    x = torch.tensor([1.5, -2.0])
    for n in (3, 1, 5):
        (out,) = program.run("forward", [x, n])
        assert torch.equal(out, n * x), n


def test_outputs_survive_the_next_run() -> None:
    program = load(serialize(add_constant_program()))
    (first,) = program.run("forward", [torch.zeros(2, 3)])
    program.run("forward", [torch.ones(2, 3)])
    assert torch.equal(first, torch.tensor([[0.5, -1.0, 2.0], [3.5, 0.0, -0.25]]))


def test_backward_jump_forever_hits_the_step_limit() -> None:
    program = build([P.Bool(False)], [P.JumpFalseCall(0, 0)], [], inputs=[], outputs=[])
    loaded = load(serialize(program), max_steps=1000)
    with pytest.raises(StepLimitError, match=r"did not finish within 1000 instructions"):
        loaded.run("forward", [])


def test_loop_that_never_meets_its_condition_is_stopped() -> None:
    # n = 0: the counter starts at 1 and never equals n.
    loaded = load(serialize(loop_program()), max_steps=10_000)
    with pytest.raises(StepLimitError) as caught:
        loaded.run("forward", [torch.ones(2), 0])
    assert caught.value.hint is not None and "--max-steps" in caught.value.hint
    # The failed run's counter does not leak into the next run.
    (out,) = loaded.run("forward", [torch.ones(2), 2])
    assert torch.equal(out, torch.full((2,), 2.0))


def test_free_call_is_a_no_op() -> None:
    program = add_constant_program()
    chain = program.execution_plan[0].chains[0]
    chain.instructions.append(P.FreeCall(0))
    chain.stacktrace.append(P.FrameList())
    (out,) = load(serialize(program)).run("forward", [torch.zeros(2, 3)])
    assert out.shape == (2, 3)


def test_user_kernel_from_a_registry() -> None:
    kernels = KernelRegistry(parent=KERNELS)
    calls = []

    @kernels.register("mylib::scale.out(Tensor x, float factor, *, Tensor(a!) out) -> Tensor(a!)")
    def scale_out(x: torch.Tensor, factor: float, *, out: torch.Tensor) -> torch.Tensor:
        calls.append(factor)
        return torch.mul(x, factor, out=out)

    values: list[P.EValue] = [planned(0, [3]), P.Double(2.5), planned(16, [3])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 2])], ["mylib::scale.out"],
                    inputs=[0], outputs=[2])
    (out,) = load(serialize(program), kernels=kernels).run("forward", [torch.ones(3)])
    assert torch.equal(out, torch.full((3,), 2.5)) and calls == [2.5]
    with pytest.raises(UnsupportedOperatorError, match="mylib::scale.out"):
        load(serialize(program))  # not in the default registry


def test_functional_aten_op_result_is_copied_into_its_slot() -> None:
    # aten::add.Tensor returns a new tensor; the interpreter copies it into %2.
    # (No target lists it, its out-variant runs instead, hence the opt-in.)
    values: list[P.EValue] = [planned(0, [2]), planned(16, [2]), P.Int(1), planned(32, [2])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3])], ["aten::add.Tensor"],
                    inputs=[0, 1], outputs=[3])
    loaded = load(serialize(program), allow_any_aten=True)
    (out,) = loaded.run("forward", [torch.ones(2), torch.full((2,), 2.0)])
    assert torch.equal(out, torch.full((2,), 3.0))


def test_mutable_state_starts_from_its_segment_and_persists() -> None:
    # %1 is planned and has initial data: state the program updates each run.
    values: list[P.EValue] = [
        planned(0, [2]),
        P.Tensor(F32, [2], [0], data_buffer_idx=1, allocation_info=P.AllocationDetails.at(1, 16)),
        P.Int(1),
        planned(32, [2]),
    ]
    instructions: list[P.Instruction] = [P.KernelCall(0, [1, 0, 2, 3, 3]), P.MoveCall(3, 1)]
    program = build(values, instructions, ["aten::add.out"], inputs=[0], outputs=[1],
                    constants=[[0.0, 0.0]])  # (the reader checks the index against constants)
    blobs = [b"", struct.pack("<2f", 3.0, 3.0)]
    segment, offsets = P.pack_subsegments(blobs, CONSTANT_ALIGNMENT)
    program.segments.append(P.DataSegment(segment))
    program.mutable_data_segments = [P.SubsegmentOffsets(1, offsets)]
    loaded = load(serialize(program))
    assert loaded.run("forward", [torch.ones(2)])[0].tolist() == [4.0, 4.0]
    assert loaded.run("forward", [torch.ones(2)])[0].tolist() == [5.0, 5.0]


# ---------------------------------------------------------------------------
# Delegates.
# ---------------------------------------------------------------------------


class AddOneBackend:
    """A test backend: out = in + 1, recording what it was given."""

    def __init__(self) -> None:
        self.inits: list[tuple[bytes, list[P.CompileSpec]]] = []

    def init(self, processed: Any, compile_specs: Any) -> str:
        self.inits.append((bytes(processed), list(compile_specs)))
        return "handle"

    def execute(self, handle: str, args: list[Any]) -> None:
        assert handle == "handle"
        source, target = args
        torch.add(source, 1.0, out=target)


def test_delegate_call_through_a_registered_backend() -> None:
    backends = BackendRegistry()
    backend = AddOneBackend()
    backends.register("ExampleBackend", backend)
    program = load(serialize(control_flow_program()), backends=backends)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for predicate in (True, False):
        (out,) = program.run("choose", [x, predicate])
        assert torch.equal(out, x + 1), predicate
    assert backend.inits == [(b"opaque payload", [P.CompileSpec("level", b"\x02")])]


def test_unknown_backend_is_a_load_time_error() -> None:
    with pytest.raises(UnsupportedOperatorError) as caught:
        load(serialize(control_flow_program()))
    message = str(caught.value)
    assert "no backend registered" in message and "'ExampleBackend'" in message
    assert "method 'choose'" in message


def test_backend_refusing_its_payload_is_a_format_error() -> None:
    class Refuses(AddOneBackend):
        def init(self, processed: Any, compile_specs: Any) -> str:
            raise ValueError("bad payload")

    backends = BackendRegistry()
    backends.register("ExampleBackend", Refuses)
    with pytest.raises(FormatError, match="could not initialise its payload: ValueError"):
        load(serialize(control_flow_program()), backends=backends)


# ---------------------------------------------------------------------------
# Load-time errors.
# ---------------------------------------------------------------------------


def test_all_missing_kernels_are_reported_together() -> None:
    values: list[P.EValue] = [planned(0, [2]), P.Int(1), planned(16, [2])]
    instructions: list[P.Instruction] = [P.KernelCall(i, [0, 0, 1, 2, 2]) for i in range(4)]
    operators = ["mylib::foo.out", "aten::add.out", "aten::no_such_op.out", "mylib::bar.default"]
    with pytest.raises(UnsupportedOperatorError) as caught:
        load(serialize(build(values, instructions, operators, inputs=[0], outputs=[2])))
    message = str(caught.value)
    assert message.startswith("no kernel for 3 operators: ")
    for name in ("mylib::foo.out", "aten::no_such_op.out", "mylib::bar.default"):
        assert name in message
    assert "aten::add.out" not in message
    assert caught.value.exit_code == 4


def test_operator_names_are_never_used_as_attributes() -> None:
    values: list[P.EValue] = [planned(0, [2])]
    program = build(values, [P.KernelCall(0, [0])], ["aten::__class__.__init__"],
                    inputs=[0], outputs=[0])
    with pytest.raises(UnsupportedOperatorError, match="aten::__class__.__init__"):
        load(serialize(program))


def test_argument_of_the_wrong_kind_is_a_format_error() -> None:
    values: list[P.EValue] = [planned(0, [2]), P.Int(3), P.Int(1), planned(16, [2])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 3])], ["aten::add.out"],
                    inputs=[0], outputs=[3])
    with pytest.raises(FormatError, match=r"argument 'other' expects Tensor .* value 1 is a Int"):
        load(serialize(program))


def test_too_few_arguments_is_a_format_error() -> None:
    values: list[P.EValue] = [planned(0, [2]), planned(16, [2])]
    program = build(values, [P.KernelCall(0, [0, 1])], ["aten::add.out"], inputs=[0], outputs=[1])
    with pytest.raises(FormatError, match="has 2 arguments, but the operator takes 4"):
        load(serialize(program))


def test_writing_into_a_constant_is_refused_at_load() -> None:
    program = add_constant_program()
    program.execution_plan[0].chains[0].instructions[0] = P.KernelCall(0, [0, 3, 2, 1, 1])
    with pytest.raises(FormatError, match="writes into value 1, a constant tensor"):
        load(serialize(program))


def test_jump_condition_must_be_a_bool() -> None:
    program = build([P.Int(0)], [P.JumpFalseCall(0, 0)], [], inputs=[], outputs=[])
    with pytest.raises(FormatError, match="is a Int, not a Bool"):
        load(serialize(program))


def test_huge_arena_is_refused_without_allocating() -> None:
    program = add_constant_program()
    program.execution_plan[0].non_const_buffer_sizes = [0, 1 << 46]  # 64 TiB
    start = time.process_time()  # CPU time: zeroing even a sliver of it would show
    with pytest.raises(ResourceError, match="more than the .* allowed .*available"):
        load(serialize(program))
    assert time.process_time() - start < 2.0


def test_max_memory_limit() -> None:
    data = serialize(add_constant_program())  # plans 64 bytes
    load(data, max_memory=64)
    with pytest.raises(ResourceError, match=r"needs 64 bytes of arenas, more than the 63 bytes"):
        load(data, max_memory=63)


def test_unsupported_element_type_is_named() -> None:
    values: list[P.EValue] = [P.Tensor(P.ScalarType.QUINT4X2, [4], [0],
                                       allocation_info=P.AllocationDetails.at(1, 0))]
    program = build(values, [], [], inputs=[0], outputs=[0])
    with pytest.raises(UnsupportedOperatorError, match="values.0. has element type qu4x2"):
        load(serialize(program))


# ---------------------------------------------------------------------------
# Run-time errors.
# ---------------------------------------------------------------------------


def test_kernel_failure_names_the_instruction_and_its_source() -> None:
    # Shapes that do not fit are refused at load; an index only the kernel reads is not.
    loaded = load(serialize(index_out_of_range_program()))
    with pytest.raises(ExecutionError) as caught:
        loaded.run("forward", [torch.zeros(4, 3)])
    message = str(caught.value)
    assert message.startswith("while executing instruction 0 (aten::index_select.out) of "
                              "method 'forward': IndexError: index out of range in self")
    assert message.endswith("(from model.py:12 in forward: return x[self.rows])")
    assert "\n" not in message
    assert isinstance(caught.value.__cause__, IndexError)


def test_dynamic_output_beyond_its_bound_fails_instead_of_overwriting() -> None:
    # expand_copy into a dynamic out planned for 4 elements, asked for 8.
    values: list[P.EValue] = [
        planned(0, [1]), P.Int(8), P.IntList([1]), P.Bool(False), planned(16, [4], dynamic=True),
        planned(32, [4]),
    ]
    program = build(values, [P.KernelCall(0, [0, 2, 3, 4, 4])], ["aten::expand_copy.out"],
                    inputs=[0], outputs=[4], arena=48)
    loaded = load(serialize(program))
    guard = loaded.method("forward").value(5)
    guard.fill_(7.0)
    with pytest.raises(ExecutionError, match="not resizable"):
        loaded.run("forward", [torch.ones(1)])
    assert torch.equal(guard, torch.full((4,), 7.0))  # the neighbour is intact


# ---------------------------------------------------------------------------
# Memory.
# ---------------------------------------------------------------------------


def _address_range(buffer: Any) -> tuple[int, int]:
    array = numpy.frombuffer(buffer, dtype=numpy.uint8)
    return array.ctypes.data, array.ctypes.data + array.nbytes


def test_constants_are_views_of_the_mapped_file(tmp_path: Path) -> None:
    program = load(write(tmp_path, add_constant_program()))
    start, end = _address_range(program.program.segments[0].data)
    weights = program.method("forward").value(1)
    assert start <= weights.data_ptr() and weights.data_ptr() + weights.nbytes <= end
    assert not weights.untyped_storage().resizable()


def test_loading_50_mb_of_weights_copies_nothing(tmp_path: Path) -> None:
    count = 50 * (1 << 20) // 4
    weights = numpy.arange(count, dtype=numpy.float32).tobytes()
    values: list[P.EValue] = [planned(0, [4]), constant(1, [count]), P.Int(1), planned(16, [4])]
    program = build(values, [], [], inputs=[0], outputs=[3], arena=32)
    segment, offsets = P.pack_subsegments([b"", weights], CONSTANT_ALIGNMENT)
    program.segments = [P.DataSegment(segment)]
    program.constant_segment = P.SubsegmentOffsets(0, offsets)
    path = write(tmp_path, program)
    loaded = load(path)
    tensor = loaded.method("forward").value(1)
    # The weights are read where the file is mapped: no copy of them exists.
    low, high = _address_range(loaded.program.segments[0].data)
    assert low <= tensor.data_ptr() < high
    assert tensor[-1].item() == count - 1


def test_planned_tensors_share_the_bytes_the_plan_gives_them() -> None:
    # %1 is a [2, 2] view of the input's bytes (a view the compiler elided).
    values: list[P.EValue] = [planned(0, [4]), planned(0, [2, 2]), planned(16, [2]),
                              P.IntList([4]), P.Int(1), P.Bool(False), P.Null()]
    program = build(values, [P.KernelCall(0, [1, 3, 5, 6, 2, 2])], ["aten::sum.IntList_out"],
                    inputs=[0], outputs=[2])
    (out,) = load(serialize(program)).run("forward", [torch.tensor([1.0, 2.0, 3.0, 4.0])])
    assert out.tolist() == [3.0, 7.0]


def test_backend_op_runs_its_registered_kernel() -> None:
    # exirc::addmm_relu.out(Tensor self, Tensor mat1, Tensor mat2, *, Tensor(a!) out)
    values: list[P.EValue] = [planned(0, [2]), planned(16, [2, 3]), planned(48, [3, 2]),
                              planned(80, [2, 2])]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 3, 3])], ["exirc::addmm_relu.out"],
                    inputs=[0, 1, 2], outputs=[3], arena=96)
    bias, mat1, mat2 = torch.tensor([0.5, -10.0]), torch.randn(2, 3), torch.randn(3, 2)
    (out,) = load(serialize(program)).run("forward", [bias, mat1, mat2])
    torch.testing.assert_close(out, torch.relu(torch.addmm(bias, mat1, mat2)))


def test_backend_raising_a_typed_error_keeps_its_type() -> None:
    from exirc.errors import UnsupportedOperatorError as Unsupported

    class RefusesNodeKind(AddOneBackend):
        def init(self, processed: Any, compile_specs: Any) -> str:
            raise Unsupported("node 3 (sigmoid) on qint8 is not implemented")

    backends = BackendRegistry()
    backends.register("ExampleBackend", RefusesNodeKind)
    with pytest.raises(Unsupported, match="node 3 \\(sigmoid\\)"):
        load(serialize(control_flow_program()), backends=backends)
