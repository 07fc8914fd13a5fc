"""A tiny decoder-only language model with a static KV cache: program state.

The keys and values of every position seen so far live in buffers that
`forward` updates in place (`index_copy_`), as LLMs exported for devices do.
exirc makes them state of the compiled program: they persist from one call
to the next, start from their value at compile time, and the two methods of
the file share them:

    prefill(tokens[1, 8], positions[8])  the prompt, 8 tokens at once
    forward(tokens[1, 1], positions[1])  one token at a time (decode)

`examples/generate.py` drives a greedy generation loop over the compiled
program from the Python API and checks it against this model in eager mode.
"""

import math

import torch
from torch import nn

VOCAB, DIM, HEADS, LAYERS, MAX_SEQ, PROMPT = 64, 32, 2, 2, 32, 8


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        shape = (1, HEADS, MAX_SEQ, DIM // HEADS)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, HEADS, DIM // HEADS).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        self.k_cache.index_copy_(2, positions, k)
        self.v_cache.index_copy_(2, positions, v)
        scores = q @ self.k_cache.transpose(2, 3) / math.sqrt(DIM // HEADS)
        visible = torch.arange(MAX_SEQ) <= positions[:, None]  # causal, over the cache
        scores = scores.masked_fill(~visible, float("-inf"))
        out = (scores.softmax(-1) @ self.v_cache).transpose(1, 2).reshape(batch, length, DIM)
        return self.proj(out)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attention = Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), positions)
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, positions)
        return self.head(self.norm(x))


torch.manual_seed(0)
model = TinyDecoder().eval()
example_inputs = (torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
methods = {"prefill": (model, (torch.zeros(1, PROMPT, dtype=torch.int64),
                               torch.arange(PROMPT)))}
