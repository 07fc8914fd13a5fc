"""A small MLP: the example model `make demo` uses.

The file follows the model-file convention of `exirc compile model.py`:
it defines `model` and `example_inputs`.
"""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


torch.manual_seed(0)
model = MLP().eval()
example_inputs = (torch.randn(2, 16),)
