"""Which arguments of a call may be the very same tensor.

A tensor a kernel writes may share no byte with another tensor of its call
(`overlap`), with one exception: an elementwise op may write over an input
that is exactly its out (the same bytes, element type, sizes and layout).
torch computes element i of such an op from element i of each input only,
reading it before writing it, so `torch.add(a, b, out=a)` is how `a.add_(b)`
works; a planner that reuses an input's memory for an elementwise result
(as in-place planners do) makes programs that are right.

How this was decided (issue 16): we loaded every program the tests, the
examples and the zoos make (exirc's own plans, whose planner never lets two
tensors live at once share bytes (`plan.placement.check_plan`), with program
state, control flow, the quantized zoo and XNNPACK delegates; and
ExecuTorch's own, with in-place buffer updates and batch norm) and recorded
every out or in-place argument sharing bytes with another argument of its
call. There were none, exact or partial: only hostile mutants had any. So
nothing that real programs need is refused, and the one exception kept is
the one that is provably safe. Anything else (an index, a matrix, a
reduction's input, a partial overlap of anything) is refused.

An op is elementwise when torch tags it `pointwise`, or it is the out
variant of an overload tagged so (the tag is on `mul.Scalar`, not on the
generated `mul.Scalar_out`). Two tensors an op writes are never allowed to
be one: each would overwrite the other's result.
"""

from __future__ import annotations

import functools

import torch

from exirc.runtime.core.kernel_arguments import TensorArgument
from exirc.runtime.kernels.registry import Kernel


def may_alias(kernel: Kernel, written: TensorArgument, other: TensorArgument) -> bool:
    """Whether `written` may be the very same tensor as `other` (the caller has
    checked they are the same bytes and layout)."""
    return not other.written and elementwise(kernel.name)


@functools.lru_cache(maxsize=1024)
def elementwise(name: str) -> bool:
    """Whether ATen op `name` ("aten::add.out") computes each element of its
    out from the same element of its inputs alone."""
    base, _, overload = name.removeprefix("aten::").partition(".")
    if not name.startswith("aten::") or not base.isidentifier():
        return False
    packet = getattr(torch.ops.aten, base, None)
    op = getattr(packet, overload or "default", None) if packet is not None else None
    if not isinstance(packet, torch._ops.OpOverloadPacket) or \
            not isinstance(op, torch._ops.OpOverload):
        return False
    if torch.Tag.pointwise in op.tags:
        return True
    inputs = _inputs(op)
    return any(torch.Tag.pointwise in twin.tags and _inputs(twin) == inputs
               and not any(arg.is_out for arg in twin._schema.arguments)
               for twin in (getattr(packet, other) for other in packet.overloads()))


def _inputs(op: torch._ops.OpOverload) -> list[tuple[str, str]]:
    """An overload's arguments but its outs: what its functional twin takes."""
    return [(arg.name, str(arg.real_type)) for arg in op._schema.arguments if not arg.is_out]
