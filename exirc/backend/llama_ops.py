"""ExecuTorch's LLM attention ops: `llama::update_cache` and `llama::custom_sdpa`.

ExecuTorch's LLM custom-op library (its runtime's `custom_ops`, which its LLM
runner links and `executorch.extension.llm.custom_ops` registers in its Python
runtime) has a KV-cache write and a causal attention over the cache, both in
the [batch, sequence, heads, head size] layout:

    update_cache(value [B, S, Hkv, D], cache [B, S_max, Hkv, D], start_pos)
        cache[:, start_pos : start_pos + S] = value, in place
    custom_sdpa(query [B, S, H, D], k_cache, v_cache [B, S_max, Hkv, D], start_pos,
                attn_mask=None, dropout_p=0, is_causal=True, scale)
        query row i attends to cache positions 0 .. start_pos + i; query head h
        reads cache head h // (H / Hkv) (grouped-query attention)

The compiler cannot use ExecuTorch's own torch ops (ExecuTorch is no
dependency, and defining ops of its namespace would clash with its library
when both are loaded), so the ATen-stage pass (`exirc.backend.bind_kv_attention`)
writes two functional stand-ins of ours that `to_edge` keeps whole:
`exirc::llama_update_cache` (returns the updated cache) and
`exirc::llama_custom_sdpa`. Their out forms are backend ops under ExecuTorch's
names, so the file names ExecuTorch's kernels: `out_form` gives custom_sdpa's;
the cache write becomes the in-place `llama::update_cache.out` on the state
itself in the plan stage (`exirc.plan.update_caches_in_place`), as no out form of a
functional write exists. The runtime has its own kernels
(`exirc.runtime.kernels.llama`), with its own copy of the schemas.
"""

from __future__ import annotations

from typing import Any

import torch

from exirc.backend.ops import BackendOp, bind_pattern_to_op

KERNEL_SET = "llama"  # the kernel list naming these ops: targets/llama_kernels.txt

_SDPA_ARGUMENTS = ("Tensor query, Tensor key, Tensor value, SymInt start_pos, "
                   "Tensor? attn_mask=None, float drpout_p=0., bool is_causal=False, "
                   "float? scale=None")
# The runtime has its own copies (exirc.runtime.kernels.llama, with the kernels):
# the compiler may not import the runtime. tests/backend checks they agree.
UPDATE_CACHE_OUT_SCHEMA = ("llama::update_cache.out(Tensor value, Tensor(a!) cache, "
                           "SymInt start_pos, *, Tensor(b!) out) -> Tensor(b!)")
CUSTOM_SDPA_OUT_SCHEMA = (f"llama::custom_sdpa.out({_SDPA_ARGUMENTS}, *, Tensor(a!) out) "
                          "-> Tensor(a!)")

_LIBRARY = torch.library.Library("exirc", "FRAGMENT")  # noqa: TOR901 (ours, kept alive)
_LIBRARY.define("llama_update_cache(Tensor value, Tensor cache, SymInt start_pos) -> Tensor")
_LIBRARY.define(f"llama_custom_sdpa({_SDPA_ARGUMENTS}) -> Tensor")


def write_cache(value: torch.Tensor, cache: torch.Tensor, start_pos: int) -> None:
    """cache[:, start_pos : start_pos + S] = value, in place."""
    cache[:, start_pos:start_pos + value.shape[1]] = value


def causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     start_pos: int, scale: float | None) -> torch.Tensor:
    """custom_sdpa's result ([B, S, H, D]): causal at `start_pos`, grouped heads."""
    length, heads = query.shape[1], query.shape[2]
    repeat = heads // key.shape[2]
    keys = key.transpose(1, 2).repeat_interleave(repeat, 1)
    values = value.transpose(1, 2).repeat_interleave(repeat, 1)
    visible = torch.arange(key.shape[1]) <= (start_pos + torch.arange(length))[:, None]
    result = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(1, 2), keys, values, visible, scale=scale)
    return result.transpose(1, 2)


def _update_cache(value: torch.Tensor, cache: torch.Tensor, start_pos: int) -> torch.Tensor:
    updated = cache.clone()
    write_cache(value, updated, start_pos)
    return updated


def _update_cache_meta(value: torch.Tensor, cache: torch.Tensor,
                       start_pos: Any) -> torch.Tensor:
    return cache.new_empty(cache.shape)


def _custom_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 start_pos: int, attn_mask: torch.Tensor | None = None, drpout_p: float = 0.0,
                 is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    assert attn_mask is None and drpout_p == 0.0 and is_causal, "only the causal form is bound"
    return causal_attention(query, key, value, start_pos, scale)


def _custom_sdpa_meta(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      start_pos: Any, attn_mask: torch.Tensor | None = None,
                      drpout_p: float = 0.0, is_causal: bool = False,
                      scale: float | None = None) -> torch.Tensor:
    return query.new_empty(query.shape)


_LIBRARY.impl("llama_update_cache", _update_cache, "CompositeExplicitAutograd")
_LIBRARY.impl("llama_update_cache", _update_cache_meta, "Meta")
_LIBRARY.impl("llama_custom_sdpa", _custom_sdpa, "CompositeExplicitAutograd")
_LIBRARY.impl("llama_custom_sdpa", _custom_sdpa_meta, "Meta")

update_cache_op = torch.ops.exirc.llama_update_cache.default
custom_sdpa_op = torch.ops.exirc.llama_custom_sdpa.default


@bind_pattern_to_op(UPDATE_CACHE_OUT_SCHEMA)  # its kernel: exirc.runtime.kernels.llama
def update_cache_out(value: torch.Tensor, cache: torch.Tensor,
                     start_pos: int) -> torch.Tensor:
    """Writes `value` into `cache` in place; the result (one element) means nothing."""
    write_cache(value, cache, start_pos)
    return value.new_zeros((1,))


@bind_pattern_to_op(CUSTOM_SDPA_OUT_SCHEMA)  # its kernel: exirc.runtime.kernels.llama
def custom_sdpa_out(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    start_pos: int, attn_mask: torch.Tensor | None = None,
                    drpout_p: float = 0.0, is_causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    """Causal attention of `query` over the cache up to `start_pos` + its rows."""
    return _custom_sdpa(query, key, value, start_pos, attn_mask, drpout_p, is_causal, scale)


def out_form(target: Any) -> BackendOp | None:
    """The backend op a stand-in runs as, or None for any other call target.
    The cache write has none here: the plan stage makes it in place."""
    return custom_sdpa_out if target is custom_sdpa_op else None


def bound_kernel(target: Any) -> str | None:
    """The kernel a program needs for a stand-in (`llama::...out`), else None."""
    if target is update_cache_op:
        return update_cache_out.kernel_name[0] + ".out"
    return "llama::custom_sdpa.out" if target is custom_sdpa_op else None
