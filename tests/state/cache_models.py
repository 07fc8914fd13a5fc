"""Tiny decoders whose KV caches are written in every way models write them.

Not a test module: the models `test_cache_patterns` compiles. Each `Decoder`
keeps its caches as buffers (persistent or not, on each attention layer or
stacked on the root module) and writes them with one `WRITE_FORMS` entry:

    index_copy   cache.index_copy_(seq_dim, pos, k)      (ExecuTorch's llama, HF's StaticCache)
    index_put    cache[:, :, pos] = k                    (advanced-index assignment)
    view_put     cache[0].index_put_((pos,), k[0])       (index_put_ through a view)
    slice_shift  cache[:, :, :-L] = cache[:, :, L:]; cache[:, :, -L:] = k   (a sliding window)
    copy         cache.copy_(cache.index_copy(...))      (a functional update copied back)
    in_place     cache.mul_(keep).add_(update)           (arithmetic in place)

Attention reads the whole cache under a mask of the positions written so far,
so a stale or lost write changes the tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

VOCAB, DIM, HEADS, LAYERS, MAX_SEQ, PROMPT = 48, 16, 2, 2, 24, 4
HEAD_DIM = DIM // HEADS
WRITE_FORMS = ("index_copy", "index_put", "view_put", "slice_shift", "copy", "in_place")

Cache = torch.Tensor  # [1, HEADS, MAX_SEQ, HEAD_DIM]


def _write(form: str, cache: Cache, positions: torch.Tensor, new: torch.Tensor) -> None:
    """Write `new` ([1, HEADS, L, HEAD_DIM]) at `positions` of `cache`, in place."""
    if form == "index_copy":
        cache.index_copy_(2, positions, new)
    elif form == "index_put":
        cache[:, :, positions] = new
    elif form == "view_put":
        cache[0].transpose(0, 1).index_put_((positions,), new[0].transpose(0, 1))
    elif form == "slice_shift":
        length = new.shape[2]
        cache[:, :, :-length] = cache[:, :, length:].clone()
        cache[:, :, -length:] = new
    elif form == "copy":
        cache.copy_(cache.index_copy(2, positions, new))
    elif form == "in_place":
        onehot = (torch.arange(MAX_SEQ)[None, :] == positions[:, None]).to(cache.dtype)
        keep = 1 - onehot.sum(0)  # [MAX_SEQ]: 0 where written
        update = onehot.t() @ new  # [1, HEADS, MAX_SEQ, HEAD_DIM]: exact (one term a row)
        cache.mul_(keep[:, None]).add_(update)
    else:
        raise ValueError(form)


def _visible(form: str, positions: torch.Tensor) -> torch.Tensor:
    """[L, MAX_SEQ]: which cache slots each query position may read."""
    slots = torch.arange(MAX_SEQ)
    if form == "slice_shift":  # the newest token sits in the last slot
        age = MAX_SEQ - 1 - slots  # how many tokens ago a slot was written
        back = positions[-1] - positions  # how far each query is behind the newest
        return (age[None, :] >= back[:, None]) & (age[None, :] <= positions[-1])
    return slots[None, :] <= positions[:, None]


class Attention(nn.Module):
    def __init__(self, form: str, persistent: bool, own_cache: bool) -> None:
        super().__init__()
        self.form = form
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        if own_cache:
            shape = (1, HEADS, MAX_SEQ, HEAD_DIM)
            self.register_buffer("k_cache", torch.zeros(shape), persistent=persistent)
            self.register_buffer("v_cache", torch.zeros(shape), persistent=persistent)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, k_cache: Cache,
                v_cache: Cache) -> torch.Tensor:
        length = x.shape[1]
        q, k, v = (t.view(1, length, HEADS, HEAD_DIM).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        _write(self.form, k_cache, positions, k)
        _write(self.form, v_cache, positions, v)
        scores = q @ k_cache.transpose(2, 3) / math.sqrt(HEAD_DIM)
        scores = scores.masked_fill(~_visible(self.form, positions), float("-inf"))
        out = (scores.softmax(-1) @ v_cache).transpose(1, 2).reshape(1, length, DIM)
        return self.proj(out)


class Decoder(nn.Module):
    """`forward(tokens [1, L], positions [L]) -> logits [1, L, VOCAB]`.

    `on_root`: the caches are two buffers of the root module, one slice a
    layer (`self.k_cache[i]`, written through that view); otherwise each
    attention layer owns its caches."""

    def __init__(self, form: str, persistent: bool, on_root: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Embedding(MAX_SEQ, DIM)
        self.layers = nn.ModuleList(Attention(form, persistent, not on_root)
                                    for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.on_root = on_root
        if on_root:
            shape = (LAYERS, 1, HEADS, MAX_SEQ, HEAD_DIM)
            self.register_buffer("k_cache", torch.zeros(shape), persistent=persistent)
            self.register_buffer("v_cache", torch.zeros(shape), persistent=persistent)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(positions)
        for i, layer in enumerate(self.layers):
            if self.on_root:
                caches = self.k_cache[i], self.v_cache[i]
            else:
                caches = layer.k_cache, layer.v_cache
            x = x + layer(x, positions, *caches)
        return self.head(self.norm(x))


def make_decoder(form: str, persistent: bool, on_root: bool) -> Decoder:
    torch.manual_seed(7)
    model = Decoder(form, persistent, on_root).eval()
    with torch.no_grad():  # weights large enough that the context decides each token
        for name, parameter in model.named_parameters():
            if not name.startswith("norm"):
                parameter.normal_(0, 0.7)
    return model


Step = Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]
"""`step(method, tokens [1, L], positions [L]) -> logits [1, L, VOCAB]`."""


def generate(step: Step, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy decoding: `prefill` on the prompt, then `forward` a token at a time."""
    logits = step("prefill", torch.tensor([prompt]), torch.arange(len(prompt)))
    tokens = [int(logits[0, -1].argmax())]
    for position in range(len(prompt), len(prompt) + new_tokens - 1):
        logits = step("forward", torch.tensor([[tokens[-1]]]), torch.tensor([position]))
        tokens.append(int(logits[0, -1].argmax()))
    return tokens


def eager_tokens(model: nn.Module, prompt: list[int], new_tokens: int) -> list[int]:
    """`generate` on the eager model, its buffers put back afterwards."""
    saved = {name: buffer.clone() for name, buffer in model.named_buffers()}

    def step(method: str, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(tokens, positions)

    try:
        return generate(step, prompt, new_tokens)
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                buffer.copy_(saved[name])
