"""The PyTorch models the base programs are compiled from.

Small on purpose: every mutant loads and runs one, thousands of times, so a
base must run in milliseconds. Between them they use what real programs use:
constants, planned memory, dynamic shapes, program state, int and float
inputs, tensor lists, optional tensors, jumps (cond, map, while_loop) and
delegates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))


class Attention(torch.nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.scale = dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        return self.norm(x + torch.matmul(attn, v))


class LSTM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 6, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return out


class Embedding(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(10, 6)
        self.head = torch.nn.Linear(6, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(ids).mean(dim=1))


class GatherTopkPad(torch.nn.Module):
    """Integer indices, several outputs, tensor lists and an int input."""

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        picked = torch.gather(x, 1, idx)
        values, indices = torch.topk(x, 2, dim=1)
        padded = F.pad(picked, (1, 2), value=0.5)
        return torch.cat([padded, values], dim=1), indices, x.index_select(0, idx[:, 0])


class Cond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.mean() > 0, lambda t: self.linear(t).relu(), lambda t: t.cos() - 1,
                          (x,))


class MapRows(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 5)

    def forward(self, xs: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.map import map as map_rows

        body: Any = map_rows  # its signature is generic over operands mypy cannot follow
        return body(lambda row, b: self.linear(row).tanh() + b, xs, bias)


class WhileCountdown(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from torch._higher_order_ops.while_loop import while_loop

        def keep_going(i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return i < n

        def step(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, self.linear(y).tanh()

        return while_loop(keep_going, step, (torch.zeros((), dtype=torch.int64), x))


class Accumulator(torch.nn.Module):
    """Program state: a buffer every run updates in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = self.get_buffer("total")
        total.add_(x)
        return total * 0.5


class IndexOps(torch.nn.Module):
    """An index input read by index_put, scatter, embedding and indexing."""

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        put = x.index_put((idx,), torch.ones(idx.shape[0], x.shape[1]))
        scattered = x.scatter(0, idx.unsqueeze(1).expand(-1, x.shape[1]), 2.0)
        return put, scattered, F.embedding(idx, x), x[idx]


class DataDependent(torch.nn.Module):
    """Outputs sized by data: masked_select by values, repeat_interleave by an
    input of repeats (bounded for planning by torch._check)."""

    def forward(self, x: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, ...]:
        picked = torch.masked_select(x, x > 0)
        torch._check(picked.shape[0] <= 12)
        spread = torch.repeat_interleave(x[:, 0], repeats)
        torch._check(spread.shape[0] <= 16)
        return picked * 2, spread


def _batch(max_rows: int = 8) -> Any:
    return ({0: torch.export.Dim("batch", min=1, max=max_rows)},)


@dataclass(frozen=True)
class Model:
    """How to build a model, its example inputs and dynamic shapes."""

    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], tuple[Any, ...]]
    dynamic_shapes: Callable[[], Any] | None = None

    def module(self) -> torch.nn.Module:
        torch.manual_seed(0)
        return self.build().eval()

    def example(self) -> tuple[Any, ...]:
        torch.manual_seed(1)
        return self.inputs()


# No max_pool2d_with_indices_backward base: torch's kernel writes through file
# data unchecked, so the runtime no longer allowlists it (exirc/runtime/kernels/allowlist.py).
MODELS: dict[str, Model] = {
    "mlp": Model(MLP, lambda: (torch.randn(2, 8),)),
    "conv": Model(ConvNet, lambda: (torch.randn(1, 3, 8, 8),)),
    "attention": Model(Attention, lambda: (torch.randn(1, 5, 8),)),
    "lstm": Model(LSTM, lambda: (torch.randn(1, 3, 4),)),
    "embedding": Model(Embedding, lambda: (torch.randint(0, 10, (2, 3)),)),
    "gather_topk_pad": Model(GatherTopkPad, lambda: (torch.randn(3, 5),
                                                     torch.randint(0, 3, (3, 2)))),
    "cond": Model(Cond, lambda: (torch.randn(3, 4),)),
    "map": Model(MapRows, lambda: (torch.randn(4, 3), torch.randn(5))),
    "while": Model(WhileCountdown, lambda: (torch.randn(2, 4), torch.tensor(3))),
    "dynamic_batch": Model(MLP, lambda: (torch.randn(4, 8),), _batch),
    "state": Model(Accumulator, lambda: (torch.randn(2, 4),)),
    "index_ops": Model(IndexOps, lambda: (torch.randn(4, 4), torch.tensor([1, 3]))),
    "data_dependent": Model(DataDependent, lambda: (torch.randn(4, 3),
                                                    torch.tensor([1, 2, 0, 1]))),
}
