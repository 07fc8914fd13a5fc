"""torch.cond and a while_loop with a data-dependent trip count."""

import torch
from torch import nn
from torch._higher_order_ops.while_loop import while_loop


class Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.cell = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))

        def more(step: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
            return (step < 3) & (state.abs().max() < 10)

        def body(step: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return step + 1, torch.tanh(self.cell(state)) + state

        steps, out = while_loop(more, body, (torch.zeros((), dtype=torch.int64), y))
        return out, steps


model = Branches().eval()
example_inputs = (torch.randn(2, 4),)
