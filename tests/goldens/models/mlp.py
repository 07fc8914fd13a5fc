"""Linear, ReLU, Linear, softmax over a dynamic batch: addmm, fusion, sym prims."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), nn.Softmax(dim=-1)).eval()
example_inputs = (torch.randn(2, 6),)
dynamic_shapes = ({0: torch.export.Dim("batch", min=1, max=16)},)
