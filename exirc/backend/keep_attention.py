"""The ATen-stage pass that keeps attention whole for `--target exirc`: each
inference `aten.scaled_dot_product_attention` it can match exactly becomes
`exirc::attention` (the op and its kernel binding: `exirc.backend.attention`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from exirc.backend.attention import attention_op
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram

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
