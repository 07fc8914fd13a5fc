"""Control flow and a dynamic batch: the second model `make demo` compiles.

A `torch.cond` picks one of two encoders by the batch's mean, then a
refinement loop applies a shared cell until the update is small or a step
limit is reached (a `while_loop` with a data-dependent trip count). The
batch dim is dynamic, 1 to 32 rows, so `exirc inspect` shows it as `s0<=32`
and `exirc run` accepts any batch in that range.
"""

import torch
from torch import nn
from torch._higher_order_ops.while_loop import while_loop


class RefineLoop(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, max_steps: int = 6) -> None:
        super().__init__()
        self.positive_encoder = nn.Linear(features, hidden)
        self.negative_encoder = nn.Linear(features, hidden)
        self.cell = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 2)
        self.max_steps = max_steps

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        encoded = torch.cond(x.mean() > 0, self.positive_encoder, self.negative_encoder, (x,))
        state = torch.tanh(encoded)

        def keep_refining(step: torch.Tensor, state: torch.Tensor,
                          change: torch.Tensor) -> torch.Tensor:
            return (step < self.max_steps) & (change > 0.05)

        def refine(step: torch.Tensor, state: torch.Tensor,
                   change: torch.Tensor) -> tuple[torch.Tensor, ...]:
            updated = torch.tanh(self.cell(state)) * 0.5 + state * 0.5
            return step + 1, updated, (updated - state).abs().max()

        steps, state, _ = while_loop(
            keep_refining, refine,
            (torch.zeros((), dtype=torch.int64), state, torch.ones(())))
        return self.head(state).softmax(-1), steps


torch.manual_seed(0)
model = RefineLoop().eval()
example_inputs = (torch.randn(4, 8),)
dynamic_shapes = ({0: torch.export.Dim("batch", min=1, max=32)},)
