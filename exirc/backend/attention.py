"""Keep attention whole: `aten.scaled_dot_product_attention` becomes `exirc::attention`.

`to_edge` decomposes `F.scaled_dot_product_attention` into some nineteen ops
per call (scaling both inputs, permutes, two bmm, softmax and a six-op guard
for fully masked rows), each paying the interpreter's dispatch, where eager
PyTorch runs one fused CPU kernel. `KeepAttention` (an ATen-stage pass, before
`to_edge` decomposes) replaces each inference call it can match exactly with
`exirc::attention`, a torch.library op no decomposition table knows, so the
Edge program keeps it as one call; its out-variant `exirc::attention.out` is
bound as a backend op (the kernel set `backend_ops`) and the runtime's kernel
(`exirc.runtime.attention_kernels`) calls torch's own
`scaled_dot_product_attention`, as eager does.

The op has no dropout and no grouped-query flag: calls with either are left
for `to_edge`. The scale is always explicit (the default, 1/sqrt(head size),
computed here), so the file says exactly what the kernel computes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from exirc.backend.ops import bind_pattern_to_op
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

_ARGUMENTS = ("Tensor query, Tensor key, Tensor value, Tensor? attn_mask, bool is_causal, "
              "float scale")
ATTENTION_SCHEMA = f"attention({_ARGUMENTS}) -> Tensor"
# The runtime has its own copy (exirc.runtime.attention_kernels, with the kernel):
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


@bind_pattern_to_op(ATTENTION_OUT_SCHEMA)  # its kernel: exirc.runtime.attention_kernels
def attention_out(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: torch.Tensor | None, is_causal: bool,
                  scale: float) -> torch.Tensor:
    """The backend op behind `exirc::attention`'s out-variant, so the
    `backend_ops` kernel set names it; its pattern is torch's attention."""
    return _attention(query, key, value, attn_mask, is_causal, scale)


_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
               "enable_gqa")
_DEFAULTS: dict[str, Any] = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False,
                             "scale": None, "enable_gqa": False}


def _fake(value: Any) -> torch.Tensor | None:
    fake = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    return fake if isinstance(fake, torch.Tensor) else None


def kept_arguments(node: torch.fx.Node) -> tuple[Any, ...] | None:
    """`exirc::attention`'s arguments for an attention call the kernel runs
    exactly as eager does, or None to leave the call for `to_edge`: no dropout,
    no grouped-query broadcast, float32 query, key and value with the same
    static batch dims and head size, a bool or float32 mask or a causal flag
    (not both)."""
    if node.op != "call_function" or node.target is not _SDPA or \
            len(node.args) > len(_PARAMETERS) or set(node.kwargs) - set(_PARAMETERS):
        return None
    given = {**_DEFAULTS, **dict(zip(_PARAMETERS, node.args)), **node.kwargs}
    if given["dropout_p"] != 0.0 or given["enable_gqa"] is not False or \
            not isinstance(given["is_causal"], bool) or \
            (given["is_causal"] and given["attn_mask"] is not None):
        return None
    query, key, value = (_fake(given[name]) for name in ("query", "key", "value"))
    if query is None or key is None or value is None or query.dim() < 2 or \
            not all(t.dtype == torch.float32 and t.dim() == query.dim() for t in (key, value)):
        return None
    sizes = [tuple(t.shape) for t in (query, key, value)]
    if not all(isinstance(s, int) for shape in sizes for s in shape) or \
            not sizes[0][:-2] == sizes[1][:-2] == sizes[2][:-2] or \
            sizes[0][-1] != sizes[1][-1] or sizes[1][-2] != sizes[2][-2] or sizes[0][-1] == 0:
        return None  # symbolic sizes, broadcast batch dims or GQA: left decomposed
    mask = given["attn_mask"]
    if mask is not None:
        fake_mask = _fake(mask)
        if fake_mask is None or fake_mask.dtype not in (torch.bool, torch.float32):
            return None
    scale = given["scale"]
    if scale is None:
        scale = 1.0 / math.sqrt(sizes[0][-1])
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        return None
    return (given["query"], given["key"], given["value"], mask, given["is_causal"],
            float(scale))


@dataclass(frozen=True)
class KeepAttention(Pass):
    """ATen -> ATen: each inference `aten.scaled_dot_product_attention` that
    `kept_arguments` matches becomes `exirc::attention` (scale explicit, no
    dropout); others are left for `to_edge` to decompose."""

    name: ClassVar[str] = "keep_attention"

    def run(self, program: ExportedProgram) -> PassResult:
        graph = program.graph_module.graph
        changed = False
        for node in list(graph.nodes):
            arguments = kept_arguments(node)
            if arguments is None:
                continue
            with graph.inserting_after(node):
                kept = graph.call_function(attention_op, arguments)
            kept.meta = dict(node.meta)
            node.replace_all_uses_with(kept)
            graph.erase_node(node)
            changed = True
        if changed:
            program.graph_module.recompile()
        return PassResult(program, changed)
