"""Kernels of ExecuTorch's LLM attention ops, `llama::update_cache.out` and
`llama::custom_sdpa.out` (what `--target xnnpack-llm` binds KV-cache attention to).

Both keep the cache as [batch, positions, kv heads, head size]:

    update_cache.out(value [B, S, Hkv, D], cache [B, S_max, Hkv, D], start_pos, out)
        writes value into cache[:, start_pos : start_pos + S]; out (one element,
        a placeholder of ExecuTorch's schema) is zeroed
    custom_sdpa.out(query [B, S, H, D], key, value [B, S_max, Hkv, D], start_pos,
                    attn_mask, dropout_p, is_causal, scale, out)
        query row i attends to positions 0 .. start_pos + i, query head h to
        cache head h // (H / Hkv); only the causal, unmasked, dropout-free form
        the compiler emits is run

The arguments come from a file, so the kernels check them before writing
anything; a refusal is an `ExecutionError`. The compiler's copy of the schemas
is `exirc.backend.llama_ops` (tests check the two agree).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.nn.functional as F

from exirc.runtime.errors import ExecutionError

_SDPA_ARGUMENTS = ("Tensor query, Tensor key, Tensor value, SymInt start_pos, "
                   "Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, "
                   "float? scale=None")
UPDATE_CACHE_OUT_SCHEMA = ("llama::update_cache.out(Tensor value, Tensor(a!) cache, "
                           "SymInt start_pos, *, Tensor(b!) out) -> Tensor(b!)")
CUSTOM_SDPA_OUT_SCHEMA = (f"llama::custom_sdpa.out({_SDPA_ARGUMENTS}, *, Tensor(a!) out) "
                          "-> Tensor(a!)")
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _fail(op: str, message: str) -> NoReturn:
    raise ExecutionError(f"llama::{op}: {message}",
                         hint="the program file is malformed, or a position is past "
                              "the cache's end")


def _check_span(op: str, start_pos: int, length: int, capacity: int) -> None:
    if start_pos < 0 or start_pos + length > capacity:
        _fail(op, f"positions {start_pos} .. {start_pos + length - 1} are outside the "
                  f"cache's {capacity}")


def update_cache_out(value: torch.Tensor, cache: torch.Tensor, start_pos: int, *,
                     out: torch.Tensor) -> torch.Tensor:
    """cache[:, start_pos : start_pos + S] = value, in place."""
    if value.dim() != 4 or cache.dim() != 4 or value.dtype != cache.dtype:
        _fail("update_cache", f"value {value.dtype} {list(value.shape)} does not fit "
                              f"cache {cache.dtype} {list(cache.shape)}")
    if [value.shape[i] for i in (0, 2, 3)] != [cache.shape[i] for i in (0, 2, 3)]:
        _fail("update_cache", f"value {list(value.shape)} and cache {list(cache.shape)} "
                              "differ outside the positions")
    _check_span("update_cache", start_pos, value.shape[1], cache.shape[1])
    cache[:, start_pos:start_pos + value.shape[1]] = value
    return out.zero_()


def _check_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     out: torch.Tensor) -> None:
    if query.dim() != 4 or key.dim() != 4 or key.shape != value.shape or \
            query.dtype not in _FLOATS or {key.dtype, value.dtype} != {query.dtype}:
        _fail("custom_sdpa", f"query {query.dtype} {list(query.shape)}, key "
                             f"{key.dtype} {list(key.shape)} and value {value.dtype} "
                             f"{list(value.shape)} are no [B, S, H, D] and two caches")
    heads, kv_heads = query.shape[2], key.shape[2]
    if query.shape[0] != key.shape[0] or query.shape[3] != key.shape[3] or \
            kv_heads == 0 or heads % kv_heads:
        _fail("custom_sdpa", f"query {list(query.shape)} does not fit the caches "
                             f"{list(key.shape)}")
    if out.dtype != query.dtype:
        _fail("custom_sdpa", f"out is {out.dtype}, not the query's {query.dtype}")
    if out.shape != query.shape:  # a dynamic length: out takes the query's, as ExecuTorch's
        before = out.shape
        try:
            out.resize_(query.shape)
        except RuntimeError:  # planned memory cannot grow
            out.resize_(before)
            _fail("custom_sdpa", f"out has room for {out.numel()} elements, not for "
                                 f"the query's {list(query.shape)}")


def custom_sdpa_out(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    start_pos: int, attn_mask: torch.Tensor | None = None,
                    drpout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None, *, out: torch.Tensor) -> torch.Tensor:
    """Causal attention of query's rows at start_pos.. over the caches, into out."""
    _check_attention(query, key, value, out)
    if attn_mask is not None or drpout_p != 0.0 or not is_causal:
        _fail("custom_sdpa", "only the causal form (no mask, no dropout) is supported")
    length = query.shape[1]
    _check_span("custom_sdpa", start_pos, length, key.shape[1])
    seen = start_pos + length  # later positions are masked out: never read
    repeat = query.shape[2] // key.shape[2]
    keys = key[:, :seen].transpose(1, 2).repeat_interleave(repeat, 1)
    values = value[:, :seen].transpose(1, 2).repeat_interleave(repeat, 1)
    visible = torch.arange(seen) <= (start_pos + torch.arange(length))[:, None]
    result = F.scaled_dot_product_attention(query.transpose(1, 2), keys, values, visible,
                                            scale=scale)
    return out.copy_(result.transpose(1, 2))


LLAMA_KERNELS: dict[str, Callable[..., Any]] = {UPDATE_CACHE_OUT_SCHEMA: update_cache_out,
                                                CUSTOM_SDPA_OUT_SCHEMA: custom_sdpa_out}
"""Schema -> kernel, merged into `exirc.runtime.kernels.exirc_ops.OWN_KERNELS`."""
