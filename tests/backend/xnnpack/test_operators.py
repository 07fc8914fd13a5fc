"""One operator (or a short chain) at a time, over the argument variants
XnnpackBackend lowers differently, on both runtimes against eager."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.backend.xnnpack.harness import eager, lower_whole, run_executorch
from tests.oracle import requires_executorch


class Fn(nn.Module):
    def __init__(self, fn: Any, **modules: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        for name, module in modules.items():
            self.add_module(name, module)

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(self, *args)


def _bn(channels: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return bn


IMAGE = (1, 4, 7, 7)
CASES: dict[str, tuple[nn.Module, tuple[tuple[int, ...], ...]]] = {
    "grouped_conv": (nn.Conv2d(4, 6, 3, groups=2), (IMAGE,)),
    "depthwise_multiplier_2": (nn.Conv2d(4, 8, 3, groups=4, padding=1), (IMAGE,)),
    "dilated_strided_conv": (nn.Conv2d(4, 4, 3, dilation=2, stride=2, padding=2), (IMAGE,)),
    "conv_without_bias_then_clamp": (
        Fn(lambda m, x: torch.clamp(m.c(x), -0.5, 0.5), c=nn.Conv2d(4, 4, 1, bias=False)),
        (IMAGE,)),
    "single_input_channel": (nn.Conv2d(1, 3, 3), ((1, 1, 6, 6),)),
    "conv1d_strided": (nn.Conv1d(4, 6, 3, stride=2), ((2, 4, 9),)),
    "conv_transpose1d": (nn.ConvTranspose1d(4, 2, 3, stride=2), ((1, 4, 5),)),
    "batch_norm_alone": (_bn(4), (IMAGE,)),
    "batch_norm_1d": (nn.BatchNorm1d(4).eval(), ((3, 4),)),
    "conv_used_twice_before_bn": (
        Fn(lambda m, x: (lambda y: (m.bn(y), y))(m.c(x)), c=nn.Conv2d(4, 4, 1), bn=_bn(4)),
        (IMAGE,)),
    "layer_norm_two_dims": (nn.LayerNorm([4, 5], elementwise_affine=False), ((2, 3, 4, 5),)),
    "linear_3d_relu": (nn.Sequential(nn.Linear(5, 3), nn.ReLU()), ((2, 4, 5),)),
    "linear_no_bias": (nn.Linear(5, 3, bias=False), ((4, 5),)),
    "addmm_full_bias": (Fn(lambda m, x, b: torch.addmm(b, x, m.l.weight.t()),
                           l=nn.Linear(5, 3)), ((4, 5), (4, 3))),
    "cat_of_six": (Fn(lambda m, x: torch.cat([x * i for i in range(6)], -1)), ((2, 3),)),
    "split_unbind": (Fn(lambda m, x: (x.split([1, 3], 1)[1], x.unbind(0)[1])), ((2, 4, 3),)),
    "avg_pool_excluding_padding": (nn.AvgPool2d(3, 2, 1, count_include_pad=False), (IMAGE,)),
    "max_pool_dilated": (nn.MaxPool2d(2, 1, dilation=2), (IMAGE,)),
    "max_pool_ceil": (nn.MaxPool2d(3, 2, ceil_mode=True), (IMAGE,)),
    "adaptive_avg_pool_7_to_1": (nn.AdaptiveAvgPool2d(1), (IMAGE,)),
    "adaptive_avg_pool_divides": (nn.AdaptiveAvgPool2d((7, 1)), (IMAGE,)),
    "bilinear_to_size": (nn.Upsample(size=(9, 4), mode="bilinear"), (IMAGE,)),
    "nearest_by_3x2": (nn.Upsample(scale_factor=(3, 2), mode="nearest"), (IMAGE,)),
    "nearest_to_size": (nn.Upsample(size=(14, 21), mode="nearest"), (IMAGE,)),
    "softmax_middle_dim": (nn.Softmax(1), ((2, 3, 4),)),
    "sum_and_mean_all": (Fn(lambda m, x: (x.sum((0, 2)), x.mean((1, 2), keepdim=True))),
                         ((2, 3, 4),)),
    "reciprocal_and_powers": (Fn(lambda m, x: (x.abs() + 1).reciprocal() + x ** -1 + x ** 0.5
                                 + x ** 3 - x ** 4 + x ** -0.5), ((3, 4),)),
    "gelu_tanh": (nn.GELU(approximate="tanh"), ((3, 4),)),
    "gelu_tanh_by_hand": (Fn(lambda m, x: 0.5 * x * (1 + torch.tanh(0.79788456 * (
        x + 0.044715 * torch.pow(x, 3.0))))), ((3, 4),)),
    "sub_alpha_constant": (Fn(lambda m, x: torch.sub(x, torch.ones(4), alpha=2)), ((3, 4),)),
    "full_like_operand": (Fn(lambda m, x: x * torch.full_like(x, 0.25)), ((3, 4),)),
    "expand_middle": (Fn(lambda m, x: x.expand(2, 3, 4) + 0), ((2, 1, 4),)),
    "select_last_dim": (Fn(lambda m, x: x.select(-1, 1) * 2), ((2, 3, 4),)),
    "group_norm": (nn.GroupNorm(2, 4), (IMAGE,)),
    "group_norm_without_affine": (nn.GroupNorm(4, 4, affine=False), ((2, 4, 5),)),
    "repeat": (Fn(lambda m, x: x.repeat(2, 1, 3) + 0), ((2, 3),)),
    "clamp_by_tensors": (Fn(lambda m, x, lo: torch.clamp(x, lo, lo + 1)), (IMAGE, (4, 1, 1))),
    "asymmetric_pad_into_conv": (Fn(lambda m, x: m.c(F.pad(x, (0, 1, 2, 1))), c=nn.Conv2d(4, 2, 3)),
                                 (IMAGE,)),
    "pad_into_conv1d": (Fn(lambda m, x: m.c(F.pad(x, (2, 0))), c=nn.Conv1d(4, 2, 3)), ((1, 4, 6),)),
    "relu_chain_fused": (Fn(lambda m, x: F.relu(F.hardtanh(x + 1, -2, 2))), ((3, 4),)),
}


# The nodes some cases must come to (the point of how they are lowered).
KINDS = {
    "asymmetric_pad_into_conv": {"STATIC_TRANSPOSE": 2, "CONV2D": 1},
    "pad_into_conv1d": {"STATIC_TRANSPOSE": 2, "STATIC_RESHAPE": 2, "CONV2D": 1},
    "conv_without_bias_then_clamp": {"STATIC_TRANSPOSE": 2, "CONV2D": 1},
    "linear_3d_relu": {"FULLY_CONNECTED": 1},
    "relu_chain_fused": {"ADD": 1},
    "gelu_tanh": {"SQUARE": 1, "MULTIPLY": 3, "ADD": 1, "SIGMOID": 1},
    "repeat": {"STATIC_RESHAPE": 2, "MULTIPLY": 1, "ADD": 1},
}


@functools.cache
def _case(name: str) -> tuple[Any, tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """The operator's lowered program (its node kinds checked), inputs and eager outputs."""
    module, shapes = CASES[name]
    torch.manual_seed(0)
    inputs = tuple(torch.randn(shape) for shape in shapes)
    if name == "reciprocal_and_powers":
        inputs = tuple(i.abs() + 0.5 for i in inputs)
    low = lower_whole(module, inputs)
    if name in KINDS:
        assert low.result.summary is not None
        assert low.result.summary.op_kinds == KINDS[name]
    return low, inputs, eager(module, inputs)


def _assert_eager(outputs: list[Any], want: list[torch.Tensor]) -> None:
    assert len(outputs) == len(want)
    for got, ref in zip(outputs, want):
        torch.testing.assert_close(torch.as_tensor(got), ref, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_operator(name: str, engine: str) -> None:
    from tests.conftest import load_on

    low, inputs, want = _case(name)
    _assert_eager(load_on(engine, low.pte).run("forward", list(inputs)), want)


@requires_executorch
@pytest.mark.parametrize("name", sorted(CASES))
def test_operator_on_executorch(name: str) -> None:
    low, inputs, want = _case(name)
    _assert_eager(run_executorch(low.pte, inputs), want)
