"""The smallest model file the CLI tests compile: one input, one output, no weights."""

TINY_MODEL = """\
import torch


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


model = Double().eval()
example_inputs = (torch.ones(2, 3),)
"""
