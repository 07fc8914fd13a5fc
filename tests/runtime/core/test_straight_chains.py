"""Chains without jumps run on the fast path (`Method._execute_straight`):
the same results, the same located errors and the same limits as the
instruction-by-instruction loop that observed and profiled runs take."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import torch

from exirc.runtime import load
from exirc.runtime.core.profile import Profile
from exirc.runtime.errors import ExecutionError, StepLimitError
from exirc.runtime.kernels.registry import KERNELS, KernelRegistry
from exirc.serialize import program as P
from exirc.serialize.program import CONSTANT_ALIGNMENT
from exirc.serialize.writer import serialize
from tests.runtime.core.test_interpreter import build, loop_program, planned

F32 = P.ScalarType.FLOAT


def add_then_bad_index_program(adds_after: int = 1) -> P.Program:
    """x + x twice, then x[I] with I = [0, 9] (row 9 does not exist: only the
    kernel finds out, at run time), then `adds_after` more adds."""
    values: list[P.EValue] = [
        planned(0, [4, 3]),  # %0 x
        P.Int(0),  # %1 dim
        P.Tensor(P.ScalarType.LONG, [2], [0], data_buffer_idx=1),  # %2 I
        planned(64, [2, 3]),  # %3 rows
        P.Int(1),  # %4 alpha
        planned(112, [4, 3]),  # %5 doubled
    ]
    add = P.KernelCall(0, [5, 5, 4, 5, 5])
    instructions: list[P.Instruction] = [P.KernelCall(0, [0, 0, 4, 5, 5]), add,
                                         P.KernelCall(1, [0, 1, 2, 3])]
    instructions += [add] * adds_after
    frames = [P.FrameList([P.Frame("model.py", 10 + i, "forward", f"line {i}")])
              for i in range(len(instructions))]
    chain = P.Chain(inputs=[0], outputs=[3], instructions=instructions, stacktrace=frames)
    plan = P.ExecutionPlan(name="forward", values=values, inputs=[0], outputs=[3, 5],
                           chains=[chain],
                           operators=[P.Operator("aten::add", "out"),
                                      P.Operator("aten::index_select", "out")],
                           non_const_buffer_sizes=[0, 160])
    segment, offsets = P.pack_subsegments([b"", struct.pack("<2q", 0, 9)], CONSTANT_ALIGNMENT)
    return P.Program(execution_plan=[plan], segments=[P.DataSegment(segment)],
                     constant_segment=P.SubsegmentOffsets(0, offsets))


def adds_program(length: int) -> P.Program:
    """forward(x: f32[3]) = x + 1 + 2 + ... + length, with alpha = k on a constant 1."""
    values: list[P.EValue] = [planned(0, [3]), P.Tensor(F32, [3], [0], data_buffer_idx=1),
                              planned(16, [3])]
    instructions: list[P.Instruction] = []
    previous = 0
    for k in range(1, length + 1):
        values.append(P.Int(k))
        instructions.append(P.KernelCall(0, [previous, 1, len(values) - 1, 2, 2]))
        previous = 2
    program = build(values, instructions, ["aten::add.out"], inputs=[0], outputs=[2],
                    constants=[[1.0, 1.0, 1.0]])
    return program


def test_a_chain_without_jumps_takes_the_fast_path_and_a_loop_does_not() -> None:
    straight = load(serialize(adds_program(5))).method("forward")
    looping = load(serialize(loop_program())).method("forward")
    straight._make_ready()  # what the first run makes
    looping._make_ready()
    assert straight._straight[0] is not None
    assert looping._straight[0] is None


@pytest.mark.parametrize("how", ["plain", "observed", "profiled"])
def test_fast_and_careful_paths_give_the_same_results(how: str) -> None:
    loaded = load(serialize(adds_program(40)))
    x = torch.tensor([0.5, -1.0, 2.0])
    seen: list[tuple[int, int]] = []
    options: dict[str, Any] = {"plain": {}, "observed": {"observer": lambda *at: seen.append(at)},
                               "profiled": {"profile": Profile()}}[how]
    for _ in range(2):  # the second run starts from the same state
        (out,) = loaded.method("forward").run([x], **options)
        assert torch.equal(out, x + sum(range(1, 41)))
    assert len(seen) == (80 if how == "observed" else 0)


@pytest.mark.parametrize("adds_after", [0, 3])
@pytest.mark.parametrize("observed", [False, True])
def test_a_failure_on_the_fast_path_names_its_instruction(observed: bool,
                                                          adds_after: int) -> None:
    loaded = load(serialize(add_then_bad_index_program(adds_after)))
    with pytest.raises(ExecutionError) as caught:
        loaded.method("forward").run([torch.zeros(4, 3)],
                                     observer=(lambda chain, index: None) if observed else None)
    message = str(caught.value)
    assert message.startswith("while executing instruction 2 (aten::index_select.out) of "
                              "method 'forward': IndexError: index out of range in self")
    assert message.endswith("(from model.py:12 in forward: line 2)")
    assert isinstance(caught.value.__cause__, IndexError)
    assert caught.value.exit_code == ExecutionError("x").exit_code


def test_a_kernels_typed_error_on_the_fast_path_is_located() -> None:
    kernels = KernelRegistry(parent=KERNELS)

    @kernels.register("mylib::refuse.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
    def refuse(x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        raise ExecutionError("x must be positive", hint="pass positive numbers")

    values: list[P.EValue] = [planned(0, [3]), P.Int(1), planned(16, [3])]
    program = build(values, [P.KernelCall(0, [0, 0, 1, 2, 2]), P.KernelCall(1, [2, 0])],
                    ["aten::add.out", "mylib::refuse.out"], inputs=[0], outputs=[0])
    with pytest.raises(ExecutionError) as caught:
        load(serialize(program), kernels=kernels).run("forward", [torch.ones(3)])
    assert str(caught.value).startswith("while executing instruction 1 (mylib::refuse.out) of "
                                        "method 'forward': x must be positive")
    assert caught.value.hint == "pass positive numbers"


def test_a_chain_longer_than_the_step_limit_still_names_where_it_ran_out() -> None:
    loaded = load(serialize(adds_program(10)), max_steps=4)
    # Counted one by one, as the careful loop counts (tests/runtime/core/test_bounded_work.py).
    with pytest.raises(StepLimitError,
                       match="within 4 instructions .* about to run instruction 5 of chain 0"):
        loaded.run("forward", [torch.zeros(3)])
    (out,) = load(serialize(adds_program(10)), max_steps=10).run("forward", [torch.zeros(3)])
    assert torch.equal(out, torch.full((3,), 55.0))


def test_a_value_written_at_run_time_is_read_fresh_on_the_fast_path() -> None:
    # alpha comes from a prim op (n + 1), so its call has no fixed partial:
    # the chain is still straight, and each run reads the new alpha.
    values: list[P.EValue] = [planned(0, [2]), P.Int(0), P.Int(1), P.Int(0), planned(16, [2])]
    instructions: list[P.Instruction] = [P.KernelCall(0, [1, 2, 3]),
                                         P.KernelCall(1, [0, 0, 3, 4, 4])]
    program = build(values, instructions, ["executorch_prim::add.Scalar", "aten::add.out"],
                    inputs=[0, 1], outputs=[4])
    loaded = load(serialize(program))
    loaded.method("forward")._make_ready()
    assert loaded.method("forward")._straight[0] is not None
    for n in (1, 4):
        (out,) = loaded.run("forward", [torch.ones(2), n])
        assert torch.equal(out, torch.full((2,), 1.0 + (n + 1)))
