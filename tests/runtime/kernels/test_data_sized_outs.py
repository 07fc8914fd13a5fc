"""Kernels whose output size comes from the data check it against the plan
before torch allocates anything (`exirc.runtime.kernels.data_sized_outs`).

Unguarded, `repeat_interleave` with repeats of 10**9 took every byte of the
machine's 24 GiB before the out's resize failed, and the OOM killer ended it.
"""

from __future__ import annotations

import resource

import numpy as np
import pytest
import torch

from exirc.errors import ResourceError
from exirc.runtime import load
from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels.data_sized_outs import out_capacity
from exirc.serialize import program as P
from exirc.serialize.writer import serialize
from tests.runtime.core.test_interpreter import build, planned

I64 = P.ScalarType.LONG
BOOL = P.ScalarType.BOOL


def repeat_interleave_program(output_size: int | None = None) -> bytes:
    """forward(repeats: i64[2]) = repeat_interleave(repeats), planned for 6 elements."""
    size: P.EValue = P.Null() if output_size is None else P.Int(output_size)
    values: list[P.EValue] = [planned(0, [2], I64), size, planned(64, [6], I64, dynamic=True)]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 2])],
                    ["aten::repeat_interleave.Tensor_out"], inputs=[0], outputs=[2])
    return serialize(program)


def masked_select_program(n: int) -> bytes:
    """forward(x: f32[n, 1], mask: bool[1, n]) = masked_select(x, mask), out f32[4]."""
    values: list[P.EValue] = [planned(0, [n, 1]), planned(4 * n, [1, n], BOOL),
                              planned(5 * n + 64, [4], dynamic=True)]
    program = build(values, [P.KernelCall(0, [0, 1, 2, 2])], ["aten::masked_select.out"],
                    inputs=[0, 1], outputs=[2], arena=5 * n + 128)
    return serialize(program)


@pytest.fixture
def memory_cap() -> object:
    """Cap this process's address space so that a guard that fails cannot take
    the machine with it: torch's allocation then fails instead of swapping."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, hard))
    yield
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_repeat_interleave_within_the_plan_runs_like_torch() -> None:
    method = load(repeat_interleave_program()).method("forward")
    repeats = torch.tensor([2, 3])
    (result,) = method.run([repeats])
    assert torch.equal(result, torch.repeat_interleave(repeats))


@pytest.mark.usefixtures("memory_cap")
@pytest.mark.parametrize("repeats", [[10**9, 10**9], [2**62, 2**62], [7, 0]])
def test_repeats_beyond_the_plan_fail_before_allocating(repeats: list[int]) -> None:
    # [2**62, 2**62] sums to 2**63, which wraps to a negative int64.
    method = load(repeat_interleave_program()).method("forward")
    with pytest.raises(ExecutionError, match="sum of repeats is .* more than the 6"):
        method.run([torch.tensor(repeats)])


@pytest.mark.usefixtures("memory_cap")
def test_negative_repeats_are_refused() -> None:
    method = load(repeat_interleave_program()).method("forward")
    with pytest.raises(ExecutionError, match="repeats may not be negative"):
        method.run([torch.tensor([-(2**40), 3])])


@pytest.mark.usefixtures("memory_cap")
def test_an_output_size_beyond_the_plan_fails_before_allocating() -> None:
    method = load(repeat_interleave_program(output_size=2**40)).method("forward")
    with pytest.raises(ExecutionError, match="output_size is .* more than the 6"):
        method.run([torch.tensor([1, 1])])


def test_masked_select_within_the_plan_runs_like_torch() -> None:
    method = load(masked_select_program(2)).method("forward")
    x, mask = torch.tensor([[1.0], [2.0]]), torch.tensor([[True, False]])
    (result,) = method.run([x, mask])
    assert torch.equal(result, torch.masked_select(x, mask))


@pytest.mark.usefixtures("memory_cap")
def test_masked_select_scratch_beyond_the_machine_is_a_resource_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 200,000 squared is 40 GB of float scratch, past any machine's memory that
    # runs this suite; the available figure is pinned so the test says so anyway.
    monkeypatch.setattr("exirc.runtime.kernels.data_sized_outs.available_memory", lambda: 8 << 30)
    n = 200_000
    method = load(masked_select_program(n)).method("forward")
    with pytest.raises(ResourceError, match="masked_select broadcasts"):
        method.run([torch.ones(n, 1), torch.ones(1, n, dtype=torch.bool)])


def test_out_capacity_is_the_planned_storage_past_the_offset() -> None:
    arena = torch.from_numpy(np.zeros(80, dtype=np.uint8))
    out = arena[16:80].view(torch.int64)[:3]
    assert out_capacity(out) == 8
