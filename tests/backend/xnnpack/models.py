"""Small models covering each operator family XnnpackBackend lowers, with
what ExecuTorch 1.5.1's own XNNPACK lowering makes of them, for comparison.

`executorch` records, for the same model and inputs, the XNNPACK nodes and
transposes in ExecuTorch's payloads and whether it delegated every node
(measured with `to_edge_transform_and_lower(..., [XnnpackPartitioner()])`
and the payloads decoded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Reference:
    nodes: int
    transposes: int
    delegated_all: bool


@dataclass(frozen=True)
class Case:
    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple[Any, ...]]
    executorch: Reference


def _bn(channels: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1, stride=2), _bn(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class MobileNetBlock(nn.Module):
    """Depthwise then pointwise, each with batch norm and relu6."""

    def __init__(self) -> None:
        super().__init__()
        self.dw, self.bn1 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), _bn(8)
        self.pw, self.bn2 = nn.Conv2d(8, 16, 1, bias=False), _bn(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu6(self.bn2(self.pw(F.relu6(self.bn1(self.dw(x))))))


class ConvTranspose(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.up(x))


class Pools(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (F.max_pool2d(x, 3, 2, padding=1), F.avg_pool2d(x, 2),
                F.avg_pool2d(x, 3, 1, padding=1), F.max_pool2d(x, 2, ceil_mode=True),
                F.adaptive_avg_pool2d(x, 1))


class DataMovement(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        moved = torch.cat([x, y, x], dim=1).permute(0, 2, 3, 1)
        picked = torch.softmax(moved, dim=-1)[:, 1:4]
        return F.pad(picked, (1, 2, 0, 1), value=0.5), torch.softmax(x, dim=1)


class Upsample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.conv(x)
        return (F.interpolate(y, scale_factor=2, mode="bilinear"),
                F.interpolate(y, scale_factor=2, mode="nearest"),
                F.interpolate(x, size=(12, 10), mode="bilinear", align_corners=True))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (part.view(b, t, 2, 8).transpose(1, 2) for part in self.qkv(x).split(16, -1))
        attention = torch.softmax((q @ k.transpose(-2, -1)) * (8 ** -0.5), dim=-1)
        return self.out((attention @ v).transpose(1, 2).reshape(b, t, c))


class Broadcasting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale, self.conv = nn.Parameter(torch.randn(4, 1, 1)), nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, row: torch.Tensor,
                z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.conv(x)
        return ((h * self.scale + row) / 2 - torch.maximum(h, z),
                torch.minimum(x, row) * 3 + 1, (x - z).abs().sqrt())


class ResidualHead(nn.Module):
    """A residual block, global pooling, flatten and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(8, 8, 3, padding=1), _bn(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1), _bn(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.relu(y + x), 1), 1))


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.down, self.mid = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.up = nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.down(x))
        b = F.relu(self.mid(F.max_pool2d(a, 2)))
        return torch.sigmoid(self.up(torch.cat([a, F.interpolate(b, scale_factor=2)], 1)))


class Norms(nn.Module):
    """Layer norm, a 1-d convolution, reductions and the unary math."""

    def __init__(self) -> None:
        super().__init__()
        self.ln, self.conv = nn.LayerNorm(8), nn.Conv1d(4, 6, 3, padding=1)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.ln(x), F.gelu(self.conv(z)), x.mean(-1, keepdim=True), x.sum(dim=1),
                F.elu(x), F.leaky_relu(x, 0.2), F.hardswish(x), x.select(1, 2),
                x.unsqueeze(1).expand(2, 3, 4, 8), torch.exp(x).log(),
                x.pow(2) + torch.rsqrt(x.abs() + 1), torch.tanh(x).floor() + x.ceil(),
                torch.sin(x) * torch.cos(x))


class PReLUHardswish(nn.Module):
    """PReLU and hardswish, which Edge decomposes, after a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.prelu = nn.Conv2d(3, 4, 3), nn.PReLU(4)
        with torch.no_grad():
            self.prelu.weight.uniform_(-1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(self.prelu(self.conv(x)))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


CASES: dict[str, Case] = {
    "mlp": Case(_mlp, lambda: (torch.randn(2, 8),), Reference(2, 0, True)),
    "conv_bn_relu": Case(ConvBnRelu, lambda: (torch.randn(1, 3, 16, 16),), Reference(3, 2, True)),
    "mobilenet_block": Case(MobileNetBlock, lambda: (torch.randn(1, 8, 12, 12),),
                            Reference(4, 2, True)),
    "conv_transpose": Case(ConvTranspose, lambda: (torch.randn(1, 8, 5, 5),),
                           Reference(4, 2, True)),
    "pools": Case(Pools, lambda: (torch.randn(1, 4, 9, 9),), Reference(9, 5, False)),
    "data_movement": Case(DataMovement, lambda: (torch.randn(1, 3, 6, 5), torch.randn(1, 2, 6, 5)),
                          Reference(5, 1, False)),
    "upsample": Case(Upsample, lambda: (torch.randn(1, 4, 6, 5),), Reference(7, 4, False)),
    "attention": Case(Attention, lambda: (torch.randn(2, 6, 16),), Reference(21, 5, False)),
    "broadcasting": Case(Broadcasting, lambda: (torch.randn(1, 4, 5, 5), torch.randn(4, 1, 5),
                                                torch.randn(1, 4, 5, 5)), Reference(17, 5, False)),
    "residual_head": Case(ResidualHead, lambda: (torch.randn(1, 8, 8, 8),), Reference(8, 2, True)),
    "unet": Case(UNet, lambda: (torch.randn(1, 3, 8, 8),), Reference(11, 5, False)),
    "norms": Case(Norms, lambda: (torch.randn(2, 4, 8), torch.randn(1, 4, 10)),
                  Reference(22, 2, False)),
    "prelu_hardswish": Case(PReLUHardswish, lambda: (torch.randn(1, 3, 6, 6),),
                            Reference(5, 2, True)),
}
