"""merge_permutes (exirc.edge.merge_permutes): permute pairs that cancel vanish,
others become one permute, and every program still gives eager's outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from exirc.compiler import CompileOptions, compile_module
from exirc.edge.merge_permutes import composed_order
from exirc.runtime import load


def permute_count_and_outputs(module: nn.Module, inputs: tuple[torch.Tensor, ...],
                              target: str) -> tuple[int, list[torch.Tensor]]:
    """How many permute_copy calls the compiled program makes, and its outputs."""
    program = load(compile_module(module, inputs, options=CompileOptions(target=target)).data)
    plan = program.program.execution_plan[0]
    names = [plan.operators[i.op_index].name for i in plan.chains[0].instructions
             if hasattr(i, "op_index")]
    return names.count("aten::permute_copy"), list(program.run("forward", list(inputs)))


class Permutes(nn.Module):
    """x permuted by `first`, then by `second`, then doubled (so the result is
    not the input); `keep_middle` also returns the middle value."""

    def __init__(self, first: list[int], second: list[int], keep_middle: bool = False) -> None:
        super().__init__()
        self.first, self.second, self.keep_middle = first, second, keep_middle

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        middle = x.permute(self.first)
        result = middle.permute(self.second) * 2
        return (result, middle + 1) if self.keep_middle else result


CASES = [
    # (first, second, keep_middle, permutes left)
    ([2, 0, 1, 3], [1, 2, 0, 3], False, 0),    # attention's pair: cancels
    ([0, 2, 1, 3], [0, 2, 1, 3], False, 0),    # a transpose twice
    ([0, -1, 1, 2], [0, 2, 3, 1], False, 0),   # negative dims
    ([2, 0, 1, 3], [0, 2, 1, 3], False, 1),    # does not cancel: one permute
    ([2, 0, 1, 3], [1, 2, 0, 3], True, 1),     # cancels; the middle stays for its user
    ([2, 0, 1, 3], [0, 2, 1, 3], True, 2),     # neither: both stay
]


@pytest.mark.parametrize("target", ["portable", "exirc"])
@pytest.mark.parametrize(("first", "second", "keep_middle", "left"), CASES)
def test_permute_pairs_merge_and_keep_eagers_outputs(first: list[int], second: list[int],
                                                     keep_middle: bool, left: int,
                                                     target: str) -> None:
    module = Permutes(first, second, keep_middle)
    x = torch.randn(2, 3, 4, 5)
    count, outputs = permute_count_and_outputs(module, (x,), target)
    expected = module(x)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    assert count == left
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


class ReturnsCancelled(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(1, 0).permute(1, 0)


def test_a_returned_pair_stays_a_copy_not_the_input() -> None:
    x = torch.randn(3, 4)
    count, outputs = permute_count_and_outputs(ReturnsCancelled(), (x,), "portable")
    assert count == 1
    torch.testing.assert_close(outputs[0], x, rtol=0, atol=0)
    outputs[0].add_(1)  # the output is its own memory, not the caller's input
    assert not torch.equal(outputs[0], x)


def test_composed_order_follows_torch() -> None:
    x = torch.randn(2, 3, 4, 5)
    for inner, outer in [([3, 1, 0, 2], [2, 0, 3, 1]), ([1, 0, 2, 3], [0, 1, 3, 2])]:
        order = composed_order(inner, outer)
        assert order is not None
        assert torch.equal(x.permute(inner).permute(outer), x.permute(order))
    assert composed_order([1, 0], [0, 1, 2]) is None
    assert composed_order([0, 0], [1, 0]) is None
