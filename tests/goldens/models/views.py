"""Views, scalars, no-op copies, a folded constant and a runtime check."""

import torch
from torch import nn


class Views(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weight = nn.Parameter(torch.randn(4, 6))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        folded = self.weight.t() * 0.5          # depends on constants only: folded
        flat = x.reshape(2, 12)[:, 2:8]         # a static view, then a slice
        y = flat.to(torch.float32) @ folded     # a no-op copy
        z = torch.cat([y, y.transpose(0, 1).reshape(2, 4)], dim=1) + 1
        return z.clamp(min=-2.0, max=2.0), x.sum(dim=(1, 2)) > 0


model = Views().eval()
example_inputs = (torch.randn(2, 3, 4),)
