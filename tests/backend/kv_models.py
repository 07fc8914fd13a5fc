"""Tiny attention layers over a static KV cache, bound or not by `--target xnnpack-llm`.

Not a test module: `test_kv_attention` compiles these. `KvAttention` writes its
caches ([1, KV_HEADS, MAX_SEQ, HEAD_DIM] buffers) with `index_copy_` at
`input_pos[0] + arange(S)` and reads them with `scaled_dot_product_attention`
under the causal mask of those positions, repeating the key and value heads
for grouped-query attention as transformers' `repeat_kv` does: the pattern
ExecuTorch's `llama::update_cache` + `llama::custom_sdpa` compute exactly.
Each `NEAR_MISSES` entry changes one thing so that they no longer do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DIM, HEADS, HEAD_DIM, MAX_SEQ = 16, 4, 4, 8
NEAR_MISSES = ("lookahead_mask", "no_mask", "other_positions", "cache_read_twice")


class KvAttention(nn.Module):
    """`forward(x [1, S, DIM], input_pos [S]) -> [1, S, DIM]`."""

    def __init__(self, kv_heads: int = HEADS, variant: str = "exact") -> None:
        super().__init__()
        self.kv_heads, self.variant = kv_heads, variant
        self.q = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.kv = nn.Linear(DIM, 2 * kv_heads * HEAD_DIM, bias=False)
        self.out = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)
        shape = (1, kv_heads, MAX_SEQ, HEAD_DIM)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def _repeat(self, cache: torch.Tensor) -> torch.Tensor:
        repeat = HEADS // self.kv_heads
        if repeat == 1:
            return cache
        batch, heads, length, size = cache.shape
        return cache[:, :, None].expand(batch, heads, repeat, length, size) \
            .reshape(batch, heads * repeat, length, size)

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        q = self.q(x).view(1, length, HEADS, HEAD_DIM).transpose(1, 2)
        k, v = (t.view(1, length, self.kv_heads, HEAD_DIM).transpose(1, 2)
                for t in self.kv(x).chunk(2, dim=-1))
        positions = input_pos[0] + torch.arange(length)
        keys = self.k_cache.index_copy_(2, positions, k)
        values = self.v_cache.index_copy_(2, positions, v)
        rows = input_pos if self.variant == "other_positions" else positions
        slots = torch.arange(MAX_SEQ)[None, :]
        if self.variant == "lookahead_mask":  # one position ahead: not causal
            rows = rows + 1
        mask = slots <= rows[:, None]
        attended = F.scaled_dot_product_attention(
            q, self._repeat(keys), self._repeat(values),
            None if self.variant == "no_mask" else mask)
        result = self.out(attended.transpose(1, 2).reshape(1, length, HEADS * HEAD_DIM))
        if self.variant == "cache_read_twice":
            result = result + keys.sum()
        return result


def make(kv_heads: int = HEADS, variant: str = "exact") -> KvAttention:
    torch.manual_seed(3)
    return KvAttention(kv_heads, variant).eval()


def inputs(length: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(start * 31 + length)
    return (torch.randn(1, length, DIM, generator=generator),
            torch.arange(start, start + length))
