"""Scaled dot-product attention, as XNNPACK defines its SDPA node.

    query [*, H, T, C]    key [*, H, U, C] or [*, U, C] (multi-query)
    value [*, H, U, D] or [*, U, D]     scale [C]     mask [T, U]
    output [*, H, T, D] = softmax((query * scale) @ key^T + mask) @ value

The scale multiplies the query per channel before the product, and the mask
is added to the logits (it is not a boolean mask).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.serialize.xnnpack import graph as G


def build_attention(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.ScaledDotProductAttention)
    ctx.check_flags(p.flags)
    roles = [(p.query_id, "query"), (p.key_id, "key"), (p.value_id, "value"),
             (p.scale_id, "scale"), (p.mask_id, "mask"), (p.output_id, "output")]
    ctx.require_float(roles)
    query, key, value = ctx.dims(p.query_id), ctx.dims(p.key_id), ctx.dims(p.value_id)
    if len(query) < 3:
        raise ctx.fail(f"its query has dims {query}; it needs at least 3 ([*, H, T, C])")
    for dims, role in ((key, "key"), (value, "value")):
        if len(dims) not in (len(query), len(query) - 1):
            raise ctx.fail(f"its {role} has dims {dims}; with a query of dims {query} it "
                           f"takes {len(query)} or {len(query) - 1} dims")
    if len(key) != len(value):
        raise ctx.fail(f"its key ({key}) and value ({value}) differ in rank")
    channels, tokens, key_tokens = query[-1], query[-2], key[-2]
    if key[-1] != channels:
        raise ctx.fail(f"its key has {key[-1]} channels, its query {channels}")
    if value[-2] != key_tokens:
        raise ctx.fail(f"its value has {value[-2]} tokens, its key {key_tokens}")
    if ctx.dims(p.scale_id) != [channels]:
        raise ctx.fail(f"its scale has dims {ctx.dims(p.scale_id)}, expected [{channels}]")
    if ctx.dims(p.mask_id) != [tokens, key_tokens]:
        raise ctx.fail(f"its mask has dims {ctx.dims(p.mask_id)}, expected "
                       f"[{tokens}, {key_tokens}]")
    q, k, v, scale, mask = (ctx.read(value_id, role) for value_id, role in roles[:5])
    out = ctx.write(p.output_id)
    multi_query = len(key) == len(query) - 1

    def run(env: Env) -> None:
        keys, values = env[k], env[v]
        if multi_query:  # one head, shared by all of the query's
            keys, values = keys.unsqueeze(-3), values.unsqueeze(-3)
        logits = torch.matmul(env[q] * env[scale], keys.transpose(-1, -2)) + env[mask]
        env[out] = torch.matmul(torch.softmax(logits, -1), values)
    return run


BUILDERS: dict[G.NodeKind, Callable[[NodeContext], Op]] = {
    G.NodeKind.SCALED_DOT_PRODUCT_ATTENTION: build_attention,
}
