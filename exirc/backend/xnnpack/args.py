"""Reading an fx node's arguments as the numbers they are.

torch.fx types every argument as the union `Argument`; these helpers say
which Python type an operator's schema puts there, in one place, for the
support rules and the emitters alike.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from exirc.backend.xnnpack.sizes import concrete

aten = torch.ops.aten
CREATORS = (aten.full.default, aten.full_like.default, aten.scalar_tensor.default)


def arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    """Argument `index` (or keyword `name`) of `node`, else `default`."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def as_int(value: Any) -> int:
    return int(value)


def as_float(value: Any) -> float:
    return float(value)


def as_ints(value: Any) -> list[int]:
    return [int(v) for v in value]


def as_numbers(value: Any) -> list[float]:
    return [float(v) for v in value]


def as_node(value: Any) -> Node:
    assert isinstance(value, Node), f"expected a node, got {value!r}"
    return value


def pair(value: Any, default: int) -> list[int]:
    """A 2-d operator's int-or-list argument as [h, w] (empty: the default)."""
    if value is None:
        return [default, default]
    values = [int(value)] if isinstance(value, int) else as_ints(value)
    if not values:
        return [default, default]
    return values * 2 if len(values) == 1 else values


def shape(value: Any) -> list[int]:
    """The logical shape of a node's tensor (output 0 of a multi-output node);
    a dynamic dim at the size point being built (`sizes`)."""
    val = as_node(value).meta["val"]
    if isinstance(val, (tuple, list)):
        val = val[0]
    return concrete(val.shape)


def created(node: Node) -> torch.Tensor | None:
    """The float32 tensor a creation op (full, full_like, scalar_tensor)
    makes: known at compile time, shapes being static."""
    if node.op != "call_function" or node.target not in CREATORS:
        return None
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32 \
            or not all(isinstance(d, int) for d in val.shape):
        return None
    fill = node.args[0] if node.target == aten.scalar_tensor.default else node.args[1]
    if isinstance(fill, Node):  # a size read at run time (scalars_to_tensors): no constant
        return None
    return torch.full([int(d) for d in val.shape], as_float(fill), dtype=torch.float32)
