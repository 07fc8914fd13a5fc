"""Bounded work: a loop is charged by what it re-runs, so no file loops for long.

Hand-built programs whose right answers (how many passes a budget allows)
follow from the cost model (`exirc.runtime.core.work`): loops of cheap
instructions count one step per instruction, as they always did; loops
around big operators are stopped after proportionally fewer passes; a limit
of CPU time catches what the estimates miss; wall-clock time limits a run
only when the caller asks. None of these verdicts can change with how busy
the machine is: a real while_loop that runs for seconds beside processes
busy on every core completes under the defaults.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from exirc.runtime import load
from exirc.runtime.core.loop_clocks import MIN_LOOP_CPU_SECONDS, loop_cpu_seconds
from exirc.runtime.core.method import DEFAULT_MAX_STEPS
from exirc.runtime.core.work import UNITS_PER_STEP, instruction_cost, prefix_sums
from exirc.runtime.errors import StepLimitError
from exirc.runtime.kernels.registry import KERNELS, Kernel, KernelRegistry
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.runtime.core.test_interpreter import build, loop_program, planned

# ---------------------------------------------------------------------------
# Programs.
# ---------------------------------------------------------------------------


def matmul_loop(n: int, *, ends: bool = False) -> P.Program:
    """forward(a: f32[n, n]) loops over out = a @ a, counting passes in value 4.

    The loop never ends unless `ends`, when it stops after the first pass.
    """
    values: list[P.EValue] = [
        planned(0, [n, n]),  # %0 a
        planned(4 * n * n, [n, n]),  # %1 out
        P.Bool(ends),  # %2 the loop's condition
        P.Int(1),  # %3 one
        P.Int(0),  # %4 passes
    ]
    instructions: list[P.Instruction] = [
        P.KernelCall(0, [0, 0, 1]),  # 0: out = a @ a
        P.KernelCall(1, [4, 3, 4]),  # 1: passes += 1
        P.JumpFalseCall(2, 0),  # 2: again, while the condition is false
    ]
    return build(values, instructions, ["aten::mm.out", "executorch_prim::add.Scalar"],
                 inputs=[0], outputs=[1], arena=8 * n * n)


def conv_loop(channels: int = 32, side: int = 64) -> P.Program:
    """forward(x: f32[1, c, s, s]) convolves x with a 3x3 planned weight, forever."""
    feature = channels * side * side * 4
    weight = channels * channels * 9 * 4
    values: list[P.EValue] = [
        planned(0, [1, channels, side, side]),  # %0 x
        planned(feature, [channels, channels, 3, 3]),  # %1 weight (zeros)
        P.Null(),  # %2 no bias
        P.Int(1), P.Int(0),  # %3, %4
        P.IntList([3, 3]), P.IntList([3, 3]), P.IntList([3, 3]),  # %5-%7 stride, padding, dilation
        P.Bool(False),  # %8 transposed
        P.IntList([4, 4]),  # %9 output padding
        planned(feature + weight, [1, channels, side, side]),  # %10 out
        P.Bool(False),  # %11 the loop's condition
    ]
    instructions: list[P.Instruction] = [
        P.KernelCall(0, [0, 1, 2, 5, 6, 7, 8, 9, 3, 10]),
        P.JumpFalseCall(11, 0),
    ]
    return build(values, instructions, ["aten::convolution.out"], inputs=[0], outputs=[10],
                 arena=2 * feature + weight)


def jump_forever() -> P.Program:
    return build([P.Bool(False)], [P.JumpFalseCall(0, 0)], [], inputs=[], outputs=[])


def costs_of(program: P.Program) -> list[int]:
    """The cost of each instruction of the program's only chain."""
    plan = program.execution_plan[0]
    kernels = {i: _kernel(op) for i, op in enumerate(plan.operators)}
    return [instruction_cost(plan, instr, kernels, []) for instr in plan.chains[0].instructions]


def _kernel(op: P.Operator) -> Kernel:
    kernel = KERNELS.find(op.name, op.overload)
    assert kernel is not None, op
    return kernel


# ---------------------------------------------------------------------------
# Loops of cheap instructions: one step per instruction, as before.
# ---------------------------------------------------------------------------


def test_a_cheap_loop_is_charged_exactly_its_instructions() -> None:
    # loop_program(n) runs 1 + 5n + 1 instructions: the budget fits exactly.
    n = 40
    x = torch.tensor([1.0, -2.0])
    (out,) = load(serialize(loop_program()), max_steps=5 * n + 2).run("forward", [x, n])
    assert torch.equal(out, n * x)
    with pytest.raises(StepLimitError, match=rf"did not finish within {5 * n + 1} instructions "
                                             r"\(the step limit\)"):
        load(serialize(loop_program()), max_steps=5 * n + 1).run("forward", [x, n])


def test_a_budget_below_the_chain_length_names_where_it_ran_out() -> None:
    # Counted instruction by instruction, as the catalogue's example shows.
    loaded = load(serialize(loop_program()), max_steps=5)
    with pytest.raises(StepLimitError) as caught:
        loaded.run("forward", [torch.ones(2), 1])
    assert caught.value.message == (
        "method 'forward' did not finish within 5 instructions (the step limit); it was about "
        "to run instruction 6 of chain 0: a loop that does not end?")


def test_a_legit_long_loop_of_cheap_instructions_runs_under_the_defaults() -> None:
    n = 50_000  # 250,000 instructions
    (out,) = load(serialize(loop_program())).run("forward", [torch.ones(2), n])
    assert torch.equal(out, torch.full((2,), float(n)))


def test_forward_jumps_are_not_charged() -> None:
    # Two instructions skipped by a forward jump: the chain's length is the budget.
    values: list[P.EValue] = [planned(0, [2]), planned(16, [2]), P.Int(1), P.Bool(False)]
    instructions: list[P.Instruction] = [
        P.JumpFalseCall(3, 3),
        P.KernelCall(0, [0, 0, 2, 1]),
        P.KernelCall(0, [0, 0, 2, 1]),
        P.KernelCall(0, [0, 0, 2, 1]),
    ]
    program = build(values, instructions, ["aten::add.out"], inputs=[0], outputs=[1])
    (out,) = load(serialize(program), max_steps=4).run("forward", [torch.ones(2)])
    assert torch.equal(out, torch.full((2,), 2.0))


# ---------------------------------------------------------------------------
# Loops around big operators: charged by their work.
# ---------------------------------------------------------------------------


def test_a_loop_around_a_big_matmul_is_charged_by_its_work() -> None:
    costs = costs_of(matmul_loop(256))
    # 256^3 multiply-adds: thousands of steps; the counter and the jump, one each.
    assert costs[0] > 1000 and costs[1:] == [1, 1]
    budget = 100_000
    loaded = load(serialize(matmul_loop(256)), max_steps=budget)
    method = loaded.method("forward")
    method.clocks.max_cpu_seconds = 1e9  # the steps decide, whatever the machine's speed
    with pytest.raises(StepLimitError) as caught:
        loaded.run("forward", [torch.eye(256)])
    passes = method.value(4)
    per_pass = sum(costs)
    # Each pass was paid for before it ran, and the budget allowed no more.
    assert len(costs) + (passes - 1) * per_pass <= budget < len(costs) + passes * per_pass
    assert caught.value.message == (
        f"method 'forward' did not finish within {budget} steps (the step limit, in which an "
        f"instruction that a loop repeats counts one step per {UNITS_PER_STEP} element "
        f"operations it does); it was about to run instructions 0 to 2 of chain 0 again, 3 "
        f"instructions costing {per_pass} steps: a loop that does not end?")
    assert caught.value.hint is not None and "--max-steps" in caught.value.hint


def test_a_small_matmul_loop_costs_one_step_per_instruction() -> None:
    assert costs_of(matmul_loop(4)) == [1, 1, 1]


def test_a_loop_that_ends_is_not_charged_for_its_work() -> None:
    # One pass of straight-line code: its length, however big its operators.
    a = torch.randn(64, 64)
    (out,) = load(serialize(matmul_loop(64, ends=True)), max_steps=3).run("forward", [a])
    assert torch.allclose(out, a @ a)


def test_an_observed_run_is_charged_the_same() -> None:
    loaded = load(serialize(matmul_loop(256)), max_steps=50_000)
    method = loaded.method("forward")
    method.clocks.max_cpu_seconds = 1e9
    seen: list[int] = []
    with pytest.raises(StepLimitError, match=r"within 50000 steps \(the step limit"):
        method.run([torch.eye(256)], observer=lambda chain, index: seen.append(index))
    per_pass = sum(costs_of(matmul_loop(256)))
    assert 2 <= method.value(4) <= 50_000 // per_pass + 1
    assert seen[:6] == [0, 1, 2, 0, 1, 2]


def test_a_hostile_loop_around_a_big_convolution_stops_on_a_tight_budget(
        tmp_path: Path) -> None:
    # Through the command line, in a process of its own, with the budget the
    # docs (running.md) give files you do not trust. The timeout only keeps a regression
    # from hanging the suite: the loop stops in a second or two of work.
    path = tmp_path / "conv_loop.pte"
    path.write_bytes(serialize(conv_loop()))
    result = subprocess.run([sys.executable, "-m", "exirc", "run", str(path), "--random",
                             "--max-steps", "1000000"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith("error[E0341]: method 'forward' did not finish within "
                                    "1000000 steps (the step limit"), result.stderr


# ---------------------------------------------------------------------------
# The clocks: CPU time, always; wall-clock time, when asked for.
# ---------------------------------------------------------------------------


def test_loops_have_a_cpu_time_limit_that_grows_with_the_step_limit() -> None:
    assert loop_cpu_seconds(DEFAULT_MAX_STEPS) == pytest.approx(2500.0)
    assert loop_cpu_seconds(10**6) == pytest.approx(2.5)
    assert loop_cpu_seconds(1000) == MIN_LOOP_CPU_SECONDS
    clocks = load(serialize(jump_forever()), max_steps=4_000_000).method("forward").clocks
    assert clocks.max_cpu_seconds == pytest.approx(10.0) and clocks.max_seconds is None


def _looping(kernel_body: Callable[[], None], registry: KernelRegistry) -> P.Program:
    """forward(x) calls budget_test::work (a step each: two elements) forever."""
    registry.register("budget_test::work.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")(
        lambda x, *, out: (kernel_body(), out.copy_(x))[1])
    values: list[P.EValue] = [planned(0, [2]), planned(16, [2]), P.Bool(False)]
    return build(values, [P.KernelCall(0, [0, 1]), P.JumpFalseCall(2, 0)],
                 ["budget_test::work.out"], inputs=[0], outputs=[1])


def test_a_kernel_the_estimates_miss_is_stopped_by_its_cpu_time() -> None:
    # A user's kernel over two elements costs one step, however much it
    # computes: the CPU time its loop spends stops it. CPU time, not the
    # clock on the wall: a busy machine only makes it take longer to stop.
    registry = KernelRegistry(parent=KERNELS)
    calls: list[float] = []

    def burn() -> None:  # 10 ms of CPU time
        calls.append(start := time.process_time())
        while time.process_time() - start < 0.01:
            pass

    loaded = load(serialize(_looping(burn, registry)), kernels=registry)
    method = loaded.method("forward")
    method.clocks.max_cpu_seconds = 0.2
    with pytest.raises(StepLimitError) as caught:
        method.run([torch.ones(2)])
    assert caught.value.message == (
        f"method 'forward' did not finish within 0.2 s of CPU time in loops (the limit that "
        f"comes with a step limit of {DEFAULT_MAX_STEPS}); it was about to run instruction 0 "
        "of chain 0 again: a loop that does not end?")
    # 20 passes of 10 ms fill the 0.2 s; the clocks are read every 10 ms.
    assert 15 <= len(calls) <= 25


@pytest.mark.parametrize("observed", [False, True])
def test_a_run_past_the_wall_clock_limit_it_was_given_is_stopped(observed: bool) -> None:
    # The loop never ends: only the limit the caller set can stop it, which
    # it does however slow the machine (there are no passes to count).
    loaded = load(serialize(jump_forever()), max_steps=10**15, max_seconds=0.05)
    method = loaded.method("forward")
    method.clocks.max_cpu_seconds = 1e9
    observer = (lambda chain, index: None) if observed else None
    with pytest.raises(StepLimitError) as caught:
        method.run([], observer=observer)
    assert caught.value.message == (
        "method 'forward' did not finish within 0.05 s (its wall-clock limit); it was about "
        "to run instruction 0 of chain 0 again: a loop that does not end?")
    assert caught.value.hint is not None and "--max-seconds" in caught.value.hint


def test_a_sleeping_kernel_is_stopped_only_by_a_wall_clock_limit() -> None:
    # Asleep, a kernel spends no CPU time: a run is a matter of wall-clock
    # time only if the caller says so.
    registry = KernelRegistry(parent=KERNELS)
    naps: list[int] = []
    loaded = load(serialize(_looping(lambda: (naps.append(1), time.sleep(0.01)), registry)),
                  kernels=registry, max_seconds=0.2)
    with pytest.raises(StepLimitError, match=r"within 0.2 s \(its wall-clock limit\)"):
        loaded.run("forward", [torch.ones(2)])
    # At most about 0.2 s of 10 ms naps (a busy machine makes fewer, never more).
    assert 1 <= len(naps) <= 40


# ---------------------------------------------------------------------------
# The cost model.
# ---------------------------------------------------------------------------


def test_a_convolution_costs_its_multiply_adds() -> None:
    small, _ = costs_of(conv_loop(channels=2, side=4))
    big, jump = costs_of(conv_loop(channels=32, side=64))
    assert jump == 1
    # 32 x 64 x 64 outputs, 32 x 9 multiply-adds each: at least a quarter
    # unit each, in steps of UNITS_PER_STEP.
    assert big >= 32 * 64 * 64 * 32 * 9 // 4 // UNITS_PER_STEP
    assert 1 < small < 100 < big


def test_a_pooling_costs_its_windows() -> None:
    def pool(kernel: int) -> int:
        values: list[P.EValue] = [
            planned(0, [1, 8, 64, 64]), P.Int(kernel), P.Int(1), P.Int(kernel // 2),
            P.IntList([1, 1]), P.IntList([2, 2]), P.IntList([3, 3]), P.IntList([2, 2]),
            P.Bool(False), planned(0, [1, 8, 64, 64]),
            P.Tensor(P.ScalarType.LONG, [1, 8, 64, 64], [0, 1, 2, 3],
                     allocation_info=P.AllocationDetails.at(1, 0)),
        ]
        program = build(values, [P.KernelCall(0, [0, 4, 5, 6, 7, 8, 9, 10])],
                        ["aten::max_pool2d_with_indices.out"], inputs=[0], outputs=[9])
        return costs_of(program)[0]

    assert pool(7) > 2 * pool(3) > 2


def test_a_delegate_costs_what_its_handle_says() -> None:
    values: list[P.EValue] = [planned(0, [1000])]
    plan = P.ExecutionPlan(name="forward", values=values, inputs=[0], outputs=[0],
                           chains=[P.Chain(instructions=[P.DelegateCall(0, [0, 0])])])
    call = plan.chains[0].instructions[0]
    opaque = instruction_cost(plan, call, {}, [object()])
    told = instruction_cost(plan, call, {}, [SimpleNamespace(work=50 * UNITS_PER_STEP)])
    assert told == opaque - 2 + 50  # the same base; 50 steps of work instead of 2


def test_corrupted_sizes_never_make_a_cost_below_one() -> None:
    program = matmul_loop(4)
    for value in program.execution_plan[0].values[:2]:
        assert isinstance(value, P.Tensor)
        value.sizes = [-1_000_000, 4]
    assert costs_of(program) == [1, 1, 1]


def test_prefix_sums_price_any_span() -> None:
    sums = prefix_sums([3, 1, 5, 2])
    assert list(sums) == [0, 3, 4, 9, 11]
    assert sums[3] - sums[1] == 1 + 5  # instructions 1 to 2
