"""The `alloc` marker: where the out-variant dialect asks for one tensor's memory.

The out-variant conversion gives every op an explicit output buffer:

    %alloc = call_function[target=exirc.plan.alloc.alloc](args = (((2, 16), torch.float32),))
    %relu = call_function[target=aten.relu.out](args = (%addmm,), kwargs = {out: %alloc})

The memory planner reads the tensor's shape and dtype from the alloc node's
`meta["val"]` (a FakeTensor whose dims may be symbolic), never from the
argument, and the compiler never calls `alloc`. Calling it, as running the
graph module eagerly in a test does, returns an empty tensor of that shape.
"""

from __future__ import annotations

import torch
from torch.fx import Node

AllocSpec = tuple[tuple[int, ...], torch.dtype]


def alloc(spec: AllocSpec) -> torch.Tensor:
    """Memory for one tensor of `spec = (shape, dtype)`."""
    shape, dtype = spec
    return torch.empty(shape, dtype=dtype)


def is_alloc(node: Node) -> bool:
    return node.op == "call_function" and node.target is alloc
