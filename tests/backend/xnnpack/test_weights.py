"""Weights in XNNPACK's layouts, and batch norms folded into convolutions:
the folded convolution computes what PyTorch's conv + batch norm computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from exirc.backend.xnnpack.weights import ConvShape, conv_filter, fold_batch_norm


def _statistics(channels: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.rand(channels, generator=g) + 0.5, torch.randn(channels, generator=g),
            torch.randn(channels, generator=g), torch.rand(channels, generator=g) + 0.5]


@pytest.mark.parametrize("groups", [1, 2, 8])
def test_folded_convolution_equals_conv_then_batch_norm(groups: int) -> None:
    x, weight, bias = torch.randn(1, 8, 7, 7), torch.randn(16, 8 // groups, 3, 3), torch.randn(16)
    gamma, beta, mean, var = _statistics(16)
    expected = F.batch_norm(F.conv2d(x, weight, bias, groups=groups), mean, var, gamma, beta,
                            training=False, eps=1e-5)
    conv = ConvShape.of(list(weight.shape), groups, transposed=False)
    w, b = fold_batch_norm(weight, bias, conv, gamma, beta, mean, var, eps=1e-5)
    torch.testing.assert_close(F.conv2d(x, w, b, groups=groups), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("groups", [1, 2])
def test_folded_transposed_convolution(groups: int) -> None:
    x, weight = torch.randn(1, 4, 5, 5), torch.randn(4, 6 // groups, 3, 3)
    gamma, beta, mean, var = _statistics(6)
    expected = F.batch_norm(F.conv_transpose2d(x, weight, stride=2, groups=groups), mean, var,
                            gamma, beta, training=False, eps=1e-3)
    conv = ConvShape.of(list(weight.shape), groups, transposed=True)
    w, b = fold_batch_norm(weight, None, conv, gamma, beta, mean, var, eps=1e-3)
    torch.testing.assert_close(F.conv_transpose2d(x, w, b, stride=2, groups=groups), expected,
                               rtol=1e-5, atol=1e-5)


def test_filter_layouts() -> None:
    regular = torch.randn(16, 4, 3, 5)
    conv = ConvShape.of(list(regular.shape), 2, transposed=False)
    assert (conv.group_input_channels, conv.group_output_channels) == (4, 8)
    assert list(conv_filter(regular, conv).shape) == [16, 3, 5, 4]     # [O, KH, KW, I/g]

    depthwise = torch.randn(16, 1, 3, 3)
    conv = ConvShape.of(list(depthwise.shape), 8, transposed=False)
    assert conv.depthwise
    # [1, KH, KW, O]
    assert torch.equal(conv_filter(depthwise, conv), depthwise.permute(1, 2, 3, 0))

    # Transposed, 2 groups: PyTorch [I, O/g, KH, KW] = [4, 3, 2, 2]; XNNPACK
    # wants, per group, output channels first: [O, KH, KW, I/g] = [6, 2, 2, 2].
    transposed = torch.arange(4 * 3 * 2 * 2, dtype=torch.float32).reshape(4, 3, 2, 2)
    conv = ConvShape.of(list(transposed.shape), 2, transposed=True)
    xnn = conv_filter(transposed, conv)
    assert list(xnn.shape) == [6, 2, 2, 2]
    # Output channel 4 is group 1's second output; its input channel 0 is
    # PyTorch's input channel 2.
    assert torch.equal(xnn[4, :, :, 0], transposed[2, 1])
