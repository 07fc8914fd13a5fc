"""A tiny SqueezeNet for the side-by-side bench: the zoo has no fire modules.

Fire modules are what set SqueezeNet apart from the zoo's ResNet and
MobileNet: a 1x1 "squeeze" convolution narrows the channels, then 1x1 and
3x3 "expand" convolutions run side by side on the result and are
concatenated (a cat of two convolution outputs, which a compiler may or may
not place without a copy). Sizes are small, like the zoo's, so that
ExecuTorch's lowering and the ONNX export take seconds.
"""

from __future__ import annotations

import torch
from torch import nn

from tests.models.zoo import ZooModel


class Fire(nn.Module):
    """squeeze 1x1 -> ReLU -> (expand 1x1 | expand 3x3) -> ReLU -> concat on channels."""

    def __init__(self, c_in: int, squeeze: int, expand1x1: int, expand3x3: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(c_in, squeeze, 1)
        self.expand1x1 = nn.Conv2d(squeeze, expand1x1, 1)
        self.expand3x3 = nn.Conv2d(squeeze, expand3x3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.expand1x1(s)), torch.relu(self.expand3x3(s))], dim=1)


class SqueezeNetTiny(nn.Module):
    """SqueezeNet 1.1's layout at a fraction of the width: strided stem, max
    pools between fire modules, a 1x1 convolution classifier, global average."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            Fire(16, 4, 8, 8), Fire(16, 4, 8, 8), nn.MaxPool2d(3, 2),
            Fire(16, 8, 16, 16), Fire(32, 8, 16, 16),
        )
        self.classifier = nn.Sequential(nn.Conv2d(32, classes, 1), nn.ReLU(),
                                        nn.AdaptiveAvgPool2d(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


SQUEEZENET_TINY = ZooModel(
    "squeezenet_tiny", SqueezeNetTiny, lambda: (torch.randn(1, 3, 48, 48),),
    ("cnn", "pooling", "cat_split"),
)
