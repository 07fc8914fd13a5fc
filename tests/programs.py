"""Small programs built by hand with the program model, for tests.

Their right answers are known by hand, which is what golden files and
figure-checking tests need.
"""

from __future__ import annotations

import struct

from exirc.serialize import metadata
from exirc.serialize import program as P
from exirc.serialize.program import CONSTANT_ALIGNMENT


def _planned(offset: int, sizes: list[int]) -> P.Tensor:
    return P.Tensor(P.ScalarType.FLOAT, sizes, list(range(len(sizes))),
                    allocation_info=P.AllocationDetails.at(1, offset))


def add_constant_program() -> P.Program:
    """forward(x: f32[2, 3]) = x + W, with W a 24-byte constant."""
    weights = struct.pack("<6f", 0.5, -1.0, 2.0, 3.5, 0.0, -0.25)
    values: list[P.EValue] = [
        _planned(0, [2, 3]),
        P.Tensor(P.ScalarType.FLOAT, [2, 3], [0, 1], data_buffer_idx=1),
        P.Int(1),
        _planned(32, [2, 3]),
    ]
    frame = P.FrameList([P.Frame("model.py", 12, "forward", "return x + self.w")])
    chain = P.Chain(inputs=[0], outputs=[3], instructions=[P.KernelCall(0, [0, 1, 2, 3, 3])],
                    stacktrace=[frame])
    plan = P.ExecutionPlan(name="forward", values=values, inputs=[0], outputs=[3],
                           chains=[chain], operators=[P.Operator("aten::add", "out")],
                           non_const_buffer_sizes=[0, 64])
    segment, offsets = P.pack_subsegments([b"", weights], CONSTANT_ALIGNMENT)
    return P.Program(execution_plan=[plan], segments=[P.DataSegment(segment)],
                     constant_segment=P.SubsegmentOffsets(0, offsets))


def assert_add_constant_runs_on_both_runtimes(data: bytes) -> None:
    """`data`, a file of `add_constant_program`'s forward however laid out,
    computes x + W on ExecuTorch's runtime and on exirc's."""
    import torch

    from exirc.runtime import load
    from tests.oracle import run_with_executorch

    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    expected = x + torch.tensor([[0.5, -1.0, 2.0], [3.5, 0.0, -0.25]])
    (theirs,) = run_with_executorch(data, (x,))
    (ours,) = load(data).run("forward", [x])
    torch.testing.assert_close(theirs, expected)
    torch.testing.assert_close(torch.as_tensor(ours), expected)


def index_out_of_range_program() -> P.Program:
    """forward(x: f32[4, 3]) = x[I] with a constant index I = [0, 9]: every
    argument fits the operator (load-time checks pass), but row 9 does not
    exist, which only the kernel finds when it reads the index."""
    values: list[P.EValue] = [
        _planned(0, [4, 3]),
        P.Int(0),
        P.Tensor(P.ScalarType.LONG, [2], [0], data_buffer_idx=1),
        _planned(64, [2, 3]),
    ]
    frame = P.FrameList([P.Frame("model.py", 12, "forward", "return x[self.rows]")])
    chain = P.Chain(inputs=[0], outputs=[3], instructions=[P.KernelCall(0, [0, 1, 2, 3])],
                    stacktrace=[frame])
    plan = P.ExecutionPlan(name="forward", values=values, inputs=[0], outputs=[3],
                           chains=[chain], operators=[P.Operator("aten::index_select", "out")],
                           non_const_buffer_sizes=[0, 96])
    segment, offsets = P.pack_subsegments([b"", struct.pack("<2q", 0, 9)], CONSTANT_ALIGNMENT)
    return P.Program(execution_plan=[plan], segments=[P.DataSegment(segment)],
                     constant_segment=P.SubsegmentOffsets(0, offsets))


def control_flow_program() -> P.Program:
    """Two methods; `choose` uses every instruction kind and list type."""
    program = add_constant_program()
    values: list[P.EValue] = [
        _planned(0, [4]),                 # %0 x
        P.Bool(True),                     # %1 predicate
        _planned(16, [4]),                # %2 y
        P.Int(2), P.Int(2),               # %3, %4
        P.IntList([3, 4]),                # %5 [2, 2]
        P.TensorList([0, 2]),             # %6
        P.OptionalTensorList([0, -1]),    # %7
        P.Null(),                         # %8
        P.Double(0.5),                    # %9
        P.String("mean"),                 # %10
        P.DoubleList([1.0, 2.5]),         # %11
        P.BoolList([True, False]),        # %12
    ]
    instructions: list[P.Instruction] = [
        P.JumpFalseCall(1, 3),
        P.KernelCall(0, [0, 9, 2, 2]),
        P.JumpFalseCall(1, 4),
        P.MoveCall(0, 2),
        P.DelegateCall(0, [0, 2]),
        P.FreeCall(0),
    ]
    delegate = P.BackendDelegate(
        "ExampleBackend", P.BackendDelegateDataReference(P.DataLocation.INLINE, 0),
        [P.CompileSpec("level", b"\x02")])
    plan = P.ExecutionPlan(
        name="choose", values=values, inputs=[0, 1], outputs=[2],
        chains=[P.Chain([0, 1], [2], instructions)],
        operators=[P.Operator("aten::mul", "Scalar_out")], delegates=[delegate],
        non_const_buffer_sizes=[0, 32],
        container_meta_type=P.ContainerMetadata("in-spec", "out-spec"))
    program.execution_plan.append(plan)
    program.backend_delegate_data.append(P.BackendDelegateInlineData(b"opaque payload"))
    return program


def without_metadata_segment(program: P.Program) -> P.Program:
    """`program` read from a file, without the `exirc.metadata` segment the
    writer adds last (stack traces, names): the program that was written."""
    if program.named_data and program.named_data[-1].key == metadata.NAMED_DATA_KEY \
            and program.named_data[-1].segment_index == len(program.segments) - 1:
        program.named_data.pop()
        program.segments.pop()
    return program
