"""Keep attention whole: `aten.scaled_dot_product_attention` becomes `exirc::attention`.

`to_edge` decomposes `F.scaled_dot_product_attention` into some nineteen ops
per call (scaling both inputs, permutes, two bmm, softmax and a six-op guard
for fully masked rows), each paying the interpreter's dispatch, where eager
PyTorch runs one fused CPU kernel. `KeepAttention` (an ATen-stage pass, before
`to_edge` decomposes: `exirc.backend.keep_attention`) replaces each inference
call it can match exactly with `exirc::attention`, a torch.library op no
decomposition table knows, so the Edge program keeps it as one call; its
out-variant `exirc::attention.out` is bound as a backend op (the kernel set
`backend_ops`) and the runtime's kernel (`exirc.runtime.kernels.attention`)
calls torch's own `scaled_dot_product_attention`, as eager does.

The op has no dropout and no grouped-query flag: calls with either are left
for `to_edge`. The scale is always explicit (the default, 1/sqrt(head size),
computed here), so the file says exactly what the kernel computes.
"""

from __future__ import annotations

import torch

from exirc.backend.ops import bind_pattern_to_op

_ARGUMENTS = ("Tensor query, Tensor key, Tensor value, Tensor? attn_mask, bool is_causal, "
              "float scale")
ATTENTION_SCHEMA = f"attention({_ARGUMENTS}) -> Tensor"
# The runtime has its own copy (exirc.runtime.kernels.attention, with the kernel):
# the compiler may not import the runtime. tests/backend checks they agree.
ATTENTION_OUT_SCHEMA = f"exirc::attention.out({_ARGUMENTS}, *, Tensor(a!) out) -> Tensor(a!)"

_LIBRARY = torch.library.Library("exirc", "FRAGMENT")  # noqa: TOR901 (ours, kept alive)
_LIBRARY.define(ATTENTION_SCHEMA)
_LIBRARY.define(ATTENTION_OUT_SCHEMA.removeprefix("exirc::"))


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attn_mask: torch.Tensor | None, is_causal: bool, scale: float) -> torch.Tensor:
    """torch's own attention: the reference the op stands for."""
    return torch.ops.aten.scaled_dot_product_attention.default(
        query, key, value, attn_mask, 0.0, is_causal, scale=scale)


def _attention_meta(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attn_mask: torch.Tensor | None, is_causal: bool,
                    scale: float) -> torch.Tensor:
    """The result's shape and dtype: the query's, with the value's head size."""
    return query.new_empty((*query.shape[:-1], value.shape[-1]))


def _attention_out(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attn_mask: torch.Tensor | None, is_causal: bool, scale: float, *,
                   out: torch.Tensor) -> torch.Tensor:
    result = _attention(query, key, value, attn_mask, is_causal, scale)
    return out.resize_(result.shape).copy_(result)


def _attention_out_meta(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attn_mask: torch.Tensor | None, is_causal: bool, scale: float, *,
                        out: torch.Tensor) -> torch.Tensor:
    return out.resize_((*query.shape[:-1], value.shape[-1]))


_LIBRARY.impl("attention", _attention, "CompositeExplicitAutograd")
_LIBRARY.impl("attention", _attention_meta, "Meta")
_LIBRARY.impl("attention.out", _attention_out, "CompositeExplicitAutograd")
_LIBRARY.impl("attention.out", _attention_out_meta, "Meta")

attention_op = torch.ops.exirc.attention.default


@bind_pattern_to_op(ATTENTION_OUT_SCHEMA)  # its kernel: exirc.runtime.kernels.attention
def attention_out(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: torch.Tensor | None, is_causal: bool,
                  scale: float) -> torch.Tensor:
    """The backend op behind `exirc::attention`'s out-variant, so the
    `backend_ops` kernel set names it; its pattern is torch's attention."""
    return _attention(query, key, value, attn_mask, is_causal, scale)
