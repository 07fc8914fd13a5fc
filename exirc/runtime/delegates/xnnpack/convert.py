"""Convert: a change of datatype.

Between float datatypes it is a cast (fp32 to fp16 rounds to nearest even,
as XNNPACK's does). Between float and quantized datatypes it is how XNNPACK
graphs quantize and dequantize: see `quant.build_quantized_convert`.
"""

from __future__ import annotations

from exirc.runtime.delegates.xnnpack.constants import FLOAT_TYPES
from exirc.runtime.delegates.xnnpack.context import Env, NodeContext, Op
from exirc.serialize.xnnpack import graph as G


def build_convert(ctx: NodeContext) -> Op:
    p = ctx.node.params
    assert isinstance(p, G.Node1x1)
    ctx.check_flags(p.flags)
    ctx.require_float([(p.input_id, "input"), (p.output_id, "output")])
    source = FLOAT_TYPES[ctx.value(p.input_id, "input").datatype]
    dtype = FLOAT_TYPES[ctx.value(p.output_id, "output").datatype]
    x = ctx.read(p.input_id, "input")
    out = ctx.write(p.output_id)
    if dtype == source:
        def copy(env: Env) -> None:
            env[out] = env[x]
        return copy

    def cast(env: Env) -> None:
        env[out] = env[x].to(dtype)
    return cast
