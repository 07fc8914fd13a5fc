"""Models with a dynamic sequence length, for the dynamic XNNPACK tests.

Not a test module. `Block` is a transformer block over [1, seq, H*D]: RMS
norm and layer norm, a fused qkv projection split three ways, heads by
view and permute, matmul/softmax attention (no mask: the mask of a causal
prefill is a bool tensor the interpreter makes), a SiLU MLP.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

HEADS, HEAD_DIM, BOUND = 2, 4, 8
WIDTH = HEADS * HEAD_DIM


class RmsNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = RmsNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(WIDTH, dim=-1)
        q, k, v = (t.view(batch, length, HEADS, HEAD_DIM).permute(0, 2, 1, 3) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-1, -2) / HEAD_DIM ** 0.5, dim=-1)
        x = x + self.out((weights @ v).permute(0, 2, 1, 3).reshape(batch, length, WIDTH))
        return x + self.down(nn.functional.silu(self.up(self.norm2(x))))


class Ops(nn.Module):
    """More operators over a dynamic dim: cat along it (a derived 2*seq) and
    along a static dim, a GQA-style expand of a static dim, a mean, a sum,
    GELU, tanh, division."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        heads = x.view(1, -1, HEADS, HEAD_DIM).permute(0, 2, 1, 3)
        repeated = heads[:, :, None].expand(1, HEADS, 3, heads.shape[2], HEAD_DIM)
        mixed = nn.functional.gelu(self.linear(y)) / 3 - x.sum(-1, keepdim=True)
        return (torch.cat([x, y], dim=1) * 2, torch.cat([x, torch.tanh(y)], dim=-1).mean(-1),
                repeated.reshape(1, 3 * HEADS, heads.shape[2], HEAD_DIM) + 1, mixed)


def block() -> Block:
    torch.manual_seed(11)
    return Block().eval()


def block_input(length: int) -> torch.Tensor:
    return torch.randn(1, length, WIDTH, generator=torch.Generator().manual_seed(length))


def seq_dim() -> Any:
    return torch.export.Dim("seq", min=1, max=BOUND)


@functools.cache
def executorch_block_pte() -> bytes:
    """`Block` with a dynamic length, lowered by ExecuTorch's XnnpackPartitioner."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    with torch.no_grad():
        exported = torch.export.export(block(), (block_input(5),),
                                       dynamic_shapes=({1: seq_dim()},))
    edge = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])
    return bytes(edge.to_executorch().buffer)
