"""Layout choices inside a payload: where the transposes go, and that every
choice computes what PyTorch computes (on ExecuTorch's runtime when it is
installed, and on exirc's)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from exirc.backend.delegation.interface import PartitionGraph
from exirc.backend.xnnpack.serializer import build_blob
from exirc.serialize.xnnpack import graph as G
from tests.backend.xnnpack.harness import eager, lower_whole, run_executorch, transposes
from tests.oracle import requires_executorch


class AfterConv(torch.nn.Module):
    """A convolution (NHWC inside the payload), then `tail` on its output."""

    def __init__(self, tail: Any) -> None:
        super().__init__()
        self.conv, self.tail = torch.nn.Conv2d(3, 4, 3, padding=1), tail

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> Any:
        return self.tail(self.conv(x), x, *rest)


CASES: dict[str, tuple[Any, tuple[int, ...], int]] = {
    # name: (tail, extra input shape, transposes expected)
    "softmax_over_channels": (lambda y, x: torch.softmax(y, 1), (), 2),
    "permuted_to_nhwc_is_free": (lambda y, x: y.permute(0, 2, 3, 1), (), 1),
    "flatten_needs_nchw": (lambda y, x: y.flatten(1) * 2, (), 2),
    "mean_over_channels": (lambda y, x: y.mean(1), (), 1),
    "slice_channels": (lambda y, x: y[:, 1:3], (), 2),
    "channel_vector_operand": (lambda y, x, v: y * v, (4, 1, 1), 2),
    "width_vector_operand": (lambda y, x, v: y + v, (5,), 2),
    "cat_with_the_input": (lambda y, x: F.relu(torch.cat([y, x], 1)), (), 2),
    "same_result_twice": (lambda y, x: (y, y), (), 2),      # and a copy
    "input_returned_as_a_copy": (lambda y, x: (torch.sigmoid(y), x.clone()), (), 2),
    "pad_and_pool_in_nhwc": (lambda y, x: F.max_pool2d(F.pad(y, (1, 1, 1, 1)), 2), (), 2),
    # The add runs in PyTorch's layout: its result is an output, so the
    # convolution's result is converted rather than y and the sum.
    "add_for_an_output": (lambda y, x, z: y + z, (1, 4, 5, 5), 2),
    # The sigmoid reads the NCHW copy the flatten made, as its result is an output.
    "unary_picks_the_copy_its_users_want": (
        lambda y, x: (y.flatten(1), torch.sigmoid(y)), (), 2),
    "transposed_back_and_forth": (lambda y, x: y.transpose(1, 3).transpose(1, 3) + 1, (), 2),
}


@functools.cache
def _case(name: str) -> tuple[Any, tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """The case's lowered program (its transposes checked), inputs and eager outputs."""
    tail, extra, expected = CASES[name]
    torch.manual_seed(0)
    model = AfterConv(tail)
    inputs = (torch.randn(1, 3, 5, 5),) + ((torch.randn(extra),) if extra else ())
    low = lower_whole(model, inputs)
    assert transposes(low.blob) == expected
    return low, inputs, eager(model, inputs)


def _assert_eager(outputs: list[Any], want: list[torch.Tensor]) -> None:
    assert len(outputs) == len(want)
    for got, ref in zip(outputs, want):
        torch.testing.assert_close(torch.as_tensor(got), ref, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_layouts(name: str, engine: str) -> None:
    from tests.conftest import load_on

    low, inputs, want = _case(name)
    _assert_eager(load_on(engine, low.pte).run("forward", list(inputs)), want)


@requires_executorch
@pytest.mark.parametrize("name", sorted(CASES))
def test_layouts_on_executorch(name: str) -> None:
    low, inputs, want = _case(name)
    _assert_eager(run_executorch(low.pte, inputs), want)


def test_nodes_of_constants_only_are_computed_at_compile_time() -> None:
    graph = fx.Graph()
    weight, x = graph.placeholder("weight"), graph.placeholder("x")
    for node, value in ((weight, torch.rand(4)), (x, torch.rand(2, 4))):
        node.meta["val"] = value
    exp = graph.call_function(torch.ops.aten.exp.default, (weight,))
    exp.meta["val"] = torch.rand(4)
    product = graph.call_function(torch.ops.aten.mul.Tensor, (x, exp))
    product.meta["val"] = torch.rand(2, 4)
    graph.output((product,))
    constants = {"weight": torch.tensor([0.0, 1.0, 2.0, 3.0])}
    blob, builder = build_blob(PartitionGraph(fx.GraphModule({}, graph), constants))
    assert [n.kind for n in blob.graph.nodes] == [G.NodeKind.MULTIPLY]
    [data] = builder.named_data.values()
    assert data == torch.tensor([0.0, 1.0, 2.0, 3.0]).exp().numpy().tobytes()
