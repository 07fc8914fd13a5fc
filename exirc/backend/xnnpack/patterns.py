"""Decomposed operators put back together, where XNNPACK has the whole one.

Edge decomposes hardswish into add/clamp/mul/div and PReLU into
gt/mul/where; XNNPACK runs either as one node. A match names the nodes it
absorbs (each used only inside the pattern, so nothing else reads them)
and what the whole operator reads. Support uses the PReLU match to take a
`where` it could not run alone; the serializer emits the whole operator at
the pattern's last node and skips the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.fx import Node

from exirc.backend.xnnpack.qdq import clamp_bounds

aten = torch.ops.aten
Constant = Callable[[Node], torch.Tensor | None]
CLAMPS = (aten.clamp.default, aten.hardtanh.default, aten.relu.default)


@dataclass(frozen=True)
class Match:
    """`root` computes op(x[, weight]); `absorbed` are the other nodes of the pattern."""

    root: Node
    x: Node
    absorbed: tuple[Node, ...]
    weight: Node | None = None


def _number(value: object, constant: Constant) -> float | None:
    """A scalar operand's value: a Python number or a one-element constant."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, Node):
        tensor = constant(value)
        if tensor is not None and tensor.numel() == 1:
            return float(tensor.reshape(()))
    return None


def _only_user(node: Node, user: Node) -> bool:
    return list(node.users) == [user]


def match_hardswish(root: Node, constant: Constant) -> Match | None:
    """x * clamp(x + 3, 0, 6) / 6 (the clamp as one or more clamps, relu, hardtanh)."""
    divisor = _number(root.args[1], constant) if len(root.args) > 1 else None
    by_six = (root.target == aten.div.Tensor and divisor == 6.0) or (
        root.target == aten.mul.Tensor and divisor is not None and abs(divisor - 1 / 6) < 1e-7)
    if not by_six:
        return None
    product = root.args[0]
    if not isinstance(product, Node) or product.target != aten.mul.Tensor \
            or not _only_user(product, root):
        return None
    for x, gate in (product.args[:2], product.args[1::-1]):
        if not isinstance(x, Node) or not isinstance(gate, Node):
            continue
        absorbed = [product]
        low, high = float("-inf"), float("inf")
        while gate.target in CLAMPS and _only_user(gate, absorbed[-1]):
            bound = clamp_bounds(gate)
            low, high = max(low, bound[0]), min(high, bound[1])
            absorbed.append(gate)
            gate = gate.args[0]
            if not isinstance(gate, Node):
                break
        if (low, high) != (0.0, 6.0) or not isinstance(gate, Node) \
                or gate.target != aten.add.Tensor or not _only_user(gate, absorbed[-1]) \
                or gate.args[0] is not x or _number(gate.args[1], constant) != 3.0 \
                or gate.kwargs.get("alpha", 1) != 1:
            continue
        return Match(root, x, (*absorbed, gate))
    return None


def match_prelu(root: Node, constant: Constant) -> Match | None:
    """where(x > 0, x, w * x) with a constant w: PyTorch's PReLU, decomposed."""
    if root.target != aten.where.self or len(root.args) != 3:
        return None
    condition, x, negative = root.args
    if not (isinstance(condition, Node) and isinstance(x, Node) and isinstance(negative, Node)):
        return None
    if condition.target != aten.gt.Scalar or condition.args[0] is not x \
            or _number(condition.args[1], constant) != 0.0 or not _only_user(condition, root):
        return None
    if negative.target != aten.mul.Tensor or not _only_user(negative, root):
        return None
    first, second = negative.args[:2]
    weight = second if first is x else first if second is x else None
    tensor = constant(weight) if isinstance(weight, Node) else None
    if tensor is None or sum(d != 1 for d in tensor.shape) > 1 or tensor.dim() > len(
            x.meta["val"].shape):
        return None  # XNNPACK's slope is per channel: one dim of x, or a single number
    assert isinstance(weight, Node)
    return Match(root, x, (condition, negative), weight)
