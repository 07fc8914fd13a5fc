"""The kernel of `exirc::attention.out`: scaled dot-product attention in one call.

Decomposed, attention is some nineteen interpreted ops; `--target exirc` keeps
the call whole (`exirc.backend.attention`) and this kernel runs torch's fused
`scaled_dot_product_attention`, as eager PyTorch does, with no dropout and the
scale the file gives. Its arguments come from a file, so the kernel checks,
before anything is written: float32 or float64 query, key and value of one
dtype and rank, the same batch dims (no broadcast, no grouped-query heads),
matching head and sequence sizes, a bool or same-dtype mask that broadcasts
to the scores' shape, not both a mask and the causal flag, a finite scale,
and an out of exactly the result's size and dtype (planned memory: never
resized). Any refusal is an `ExecutionError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.nn.functional as F

from exirc.runtime.errors import ExecutionError

ATTENTION_OUT_SCHEMA = (
    "exirc::attention.out(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
    "bool is_causal, float scale, *, Tensor(a!) out) -> Tensor(a!)")


def _fail(message: str) -> NoReturn:
    raise ExecutionError(f"exirc::attention: {message}",
                         hint="the program file is malformed; recompile the model")


def _check_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    if query.dtype not in (torch.float32, torch.float64):
        _fail(f"query must be float32 or float64, not {query.dtype}")
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dtype != query.dtype:
            _fail(f"{name} is {tensor.dtype}, but query is {query.dtype}")
        if tensor.dim() != query.dim():
            _fail(f"{name} has {tensor.dim()} dims, but query has {query.dim()}")
    if query.dim() < 2:
        _fail(f"query has {query.dim()} dims: attention takes (..., length, head size)")
    batch = list(query.shape[:-2])
    for name, tensor in (("key", key), ("value", value)):
        if list(tensor.shape[:-2]) != batch:
            _fail(f"{name} has batch dims {list(tensor.shape[:-2])}, but query has {batch}")
    if key.shape[-1] != query.shape[-1] or query.shape[-1] == 0:
        _fail(f"key's head size {key.shape[-1]} is not query's {query.shape[-1]} "
              "(or it is 0)")
    if value.shape[-2] != key.shape[-2]:
        _fail(f"value has {value.shape[-2]} positions, but key has {key.shape[-2]}")


def _check_mask(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None,
                is_causal: bool) -> None:
    if attn_mask is None:
        return
    if is_causal:
        _fail("both a mask and is_causal: the op takes one or the other")
    if attn_mask.dtype not in (torch.bool, query.dtype):
        _fail(f"attn_mask is {attn_mask.dtype}: it must be bool or {query.dtype}")
    scores = [*query.shape[:-1], key.shape[-2]]
    try:
        broadcast = list(torch.broadcast_shapes(attn_mask.shape, scores))
    except RuntimeError:
        broadcast = None
    if broadcast != scores:
        _fail(f"attn_mask of shape {list(attn_mask.shape)} does not broadcast to the "
              f"scores' shape {scores}")


def attention_out(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: torch.Tensor | None, is_causal: bool, scale: float, *,
                  out: torch.Tensor) -> torch.Tensor:
    """softmax(query @ key^T * scale (+ mask)) @ value, as torch computes it, into `out`."""
    _check_inputs(query, key, value)
    _check_mask(query, key, attn_mask, is_causal)
    if not math.isfinite(scale):
        _fail(f"scale is {scale}: it must be a finite number")
    sizes = [*query.shape[:-1], value.shape[-1]]
    if list(out.shape) != sizes or out.dtype != query.dtype:
        _fail(f"out is {out.dtype} {list(out.shape)}, but attention makes "
              f"{query.dtype} {sizes}")
    try:
        result = F.scaled_dot_product_attention(query, key, value, attn_mask, 0.0,
                                                bool(is_causal), scale=scale)
    except RuntimeError as error:  # anything the checks above let through
        _fail(f"torch refuses the arguments: {str(error).splitlines()[0]}")
    return out.copy_(result)


ATTENTION_KERNELS: dict[str, Callable[..., Any]] = {ATTENTION_OUT_SCHEMA: attention_out}
"""Schema -> kernel, merged into `exirc.runtime.kernels.exirc_ops.OWN_KERNELS`."""
