"""A while_loop that runs for seconds completes under the default budget, on a
busy machine too (issue 35).

The program is the issue's: 300 passes of y = tanh(y @ w) over 512x512
matrices, which eager PyTorch runs in a second or a few. The runtime's
default budget once stopped it after 0.6 s (1,000,000 steps, and 2.5 s of
wall-clock time for loops); now loops are bounded by work alone (steps, and
CPU time as a backstop), so it completes beside processes that keep every
core busy, and the same loop without an end still stops on its budget.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch._higher_order_ops.while_loop import while_loop

from exirc.cli.run_timing import torch_threads
from exirc.compiler import compile_module
from exirc.runtime import load
from exirc.runtime.errors import StepLimitError
from tests.busy_machine import busy_neighbours

SIDE = 512
PASSES = 300


class MatmulLoop(torch.nn.Module):
    """y = tanh(y @ w), `n` times; returns the passes made and y."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(SIDE, SIDE) / SIDE ** 0.5)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def keep_going(i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return i < n

        def step(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, torch.tanh(y @ self.w)

        return while_loop(keep_going, step, (torch.zeros((), dtype=torch.int64), x))


@functools.cache
def _compiled() -> tuple[MatmulLoop, bytes]:
    torch.manual_seed(0)
    model = MatmulLoop().eval()
    return model, compile_module(model, (torch.randn(SIDE, SIDE), torch.tensor(3))).data


def test_a_loop_of_seconds_completes_under_the_defaults_on_a_busy_machine() -> None:
    model, data = _compiled()
    x = torch.randn(SIDE, SIDE)
    # One thread, as `exirc run` uses by default: torch's threads wait for
    # each other on a busy machine, which would only make the test longer.
    with torch_threads(1):
        with busy_neighbours() as neighbours:
            passes, y = load(data).run("forward", [x, torch.tensor(PASSES)])
            assert all(neighbour.poll() is None for neighbour in neighbours)  # busy throughout
        with torch.no_grad():
            expected_passes, expected = model(x, torch.tensor(PASSES))
    assert int(passes) == int(expected_passes) == PASSES
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)


def test_the_loop_without_an_end_stops_on_its_work_budget() -> None:
    # n beyond reach: the budget ends it, with a typed error naming the loop.
    _, data = _compiled()
    program = load(data, max_steps=2_000_000)
    with pytest.raises(StepLimitError, match=r"did not finish within 2000000 steps \(the step "
                                             r"limit, in which an instruction that a loop "
                                             r"repeats counts"):
        program.run("forward", [torch.randn(SIDE, SIDE), torch.tensor(2**62)])
