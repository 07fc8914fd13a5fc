"""Weights rearranged, at compile time, into the layouts XNNPACK's operators read.

PyTorch stores a convolution filter as [O, I/groups, KH, KW] and a
transposed one as [I, O/groups, KH, KW]; XNNPACK wants [O, KH, KW, I/groups]
for both (per group, output channels first), and [1, KH, KW, O] for a
depthwise filter. Batch norms after a convolution fold into its filter and
bias here, so they cost nothing at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ConvShape:
    """What kind of XNNPACK convolution a PyTorch one is, from its filter."""

    groups: int
    group_input_channels: int
    group_output_channels: int
    transposed: bool

    @property
    def depthwise(self) -> bool:
        # One input channel per group and a whole number of outputs for it:
        # XNNPACK's depthwise kernels (depth multiplier = outputs per group).
        return not self.transposed and self.group_input_channels == 1

    @classmethod
    def of(cls, weight_shape: list[int], groups: int, transposed: bool) -> ConvShape:
        if transposed:
            return cls(groups, weight_shape[0] // groups, weight_shape[1], True)
        return cls(groups, weight_shape[1], weight_shape[0] // groups, False)


def conv_filter(weight: torch.Tensor, conv: ConvShape) -> torch.Tensor:
    """A 2-d PyTorch filter in XNNPACK's layout for `conv`."""
    if conv.depthwise:
        return weight.permute(1, 2, 3, 0)                   # [1, KH, KW, O]
    if not conv.transposed:
        return weight.permute(0, 2, 3, 1)                   # [O, KH, KW, I/g]
    g, kh, kw = conv.groups, weight.shape[2], weight.shape[3]
    per_group = weight.reshape(g, conv.group_input_channels, conv.group_output_channels, kh, kw)
    return per_group.permute(0, 2, 3, 4, 1).reshape(          # [g*O/g, KH, KW, I/g]
        g * conv.group_output_channels, kh, kw, conv.group_input_channels)


def fold_batch_norm(weight: torch.Tensor, bias: torch.Tensor | None, conv: ConvShape,
                    bn_weight: torch.Tensor | None, bn_bias: torch.Tensor | None,
                    mean: torch.Tensor, var: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The filter and bias of `batch_norm(conv(x))` as one convolution.

    Worked in float64 so the folded weights round once, to float32, at the end.
    """
    scale, shift = batch_norm_affine(bn_weight, bn_bias, mean, var, eps)
    out_channels = conv.groups * conv.group_output_channels
    w = weight.to(torch.float64)
    if conv.transposed:
        # Output channel o = group * (O/g) + j sits at weight[group's inputs, j].
        per_group = w.reshape(conv.groups, conv.group_input_channels,
                              conv.group_output_channels, *w.shape[2:])
        s = scale.reshape(conv.groups, 1, conv.group_output_channels,
                          *([1] * (w.dim() - 2)))
        w = (per_group * s).reshape(w.shape)
    else:
        w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    b = torch.zeros(out_channels, dtype=torch.float64) if bias is None else bias.to(torch.float64)
    return w.to(torch.float32), (b * scale + shift).to(torch.float32)


def batch_norm_affine(bn_weight: torch.Tensor | None, bn_bias: torch.Tensor | None,
                      mean: torch.Tensor, var: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift), in float64, with batch_norm(x) = x * scale + shift per channel."""
    inv_std = torch.rsqrt(var.to(torch.float64) + eps)
    scale = inv_std if bn_weight is None else bn_weight.to(torch.float64) * inv_std
    shift = -mean.to(torch.float64) * scale
    if bn_bias is not None:
        shift = shift + bn_bias.to(torch.float64)
    return scale, shift
