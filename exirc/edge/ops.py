"""Which operators the Edge dialect admits.

The core ATen op set (ops tagged `torch.Tag.core`), the functional `_copy`
twins of its view ops (views become copies on the way to Edge), size
queries on SymInts, `getitem` on multi-output ops and the higher-order
control-flow ops.
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import torch

# Size queries return SymInts, not tensors: they stay until the backend
# stage turns size arithmetic into prim ops.
SIZE_OPS = frozenset({"aten::sym_size.int", "aten::sym_numel", "aten::sym_stride.int",
                      "aten::sym_storage_offset"})


def qualified_name(op: torch._ops.OpOverload) -> str:
    return f"{op._schema.name}.{op._overloadname}" if op._overloadname != "default" \
        else op._schema.name


def copy_twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional `_copy` op of a view op, e.g. permute -> permute_copy."""
    name = op._schema.name.split("::")[1]
    namespace = op.namespace
    packet = getattr(getattr(torch.ops, namespace), f"{name.lstrip('_')}_copy", None)
    if name == "_unsafe_view":
        packet = torch.ops.aten.view_copy
    if packet is None:
        return None
    twin = getattr(packet, op._overloadname, None)
    return twin if isinstance(twin, torch._ops.OpOverload) else None


@functools.lru_cache(maxsize=1)
def _copy_twins() -> frozenset[Any]:
    twins = set()
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags and op.is_view:
                twin = copy_twin(op)
                if twin is not None:
                    twins.add(twin)
    return frozenset(twins)


# The Q/DQ ops pt2e's convert_pt2e writes (torch and torchao define them): Edge
# ops with dtype constraints (quantized_dtype_constraints.yaml), which backend
# passes fuse (QuantFusion) or lower to their out forms.
QUANTIZE_OPS = frozenset({
    "quantize_per_tensor", "quantize_per_tensor.tensor", "quantize_per_channel",
    "quantize_per_token", "quantize_per_channel_group", "dequantize_per_tensor",
    "dequantize_per_tensor.tensor", "dequantize_per_channel", "dequantize_per_token",
    "dequantize_per_channel_group", "choose_qparams.tensor",
    "choose_qparams_per_token_asymmetric"})


def is_quantize_op(target: Any) -> bool:
    """Whether `target` is one of the Edge dialect's Q/DQ ops (`QUANTIZE_OPS`)."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace != "quantized_decomposed":
        return False
    return qualified_name(target).split("::", 1)[1] in QUANTIZE_OPS


def is_edge_op(target: Any) -> bool:
    if target is operator.getitem:
        return True
    if is_quantize_op(target):
        return True
    if isinstance(target, torch._ops.HigherOrderOperator):
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if f"{target._schema.name}.{target._overloadname}" in SIZE_OPS or \
            target._schema.name in SIZE_OPS:
        return True
    if target.is_view:
        return False  # views must have become copies
    return torch.Tag.core in target.tags or target in _copy_twins()


# Namespaces of torch's own operators. An OpOverload from any other namespace
# is a custom operator (`torch.library.custom_op`, `TORCH_LIBRARY`), which the
# Edge dialect admits as the model calls it: only a kernel can run it.
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "_prims", "quantized", "debugprims"})


def is_custom_op(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and \
        target.namespace not in _TORCH_NAMESPACES


@functools.lru_cache(maxsize=1)
def _to_edge_table() -> frozenset[Any]:
    from exirc.edge.decompositions import EXTRA_DECOMPOSITIONS

    return frozenset(torch.export.default_decompositions().keys()) | \
        frozenset(EXTRA_DECOMPOSITIONS)


def has_decomposition(target: Any) -> bool:
    """Whether the `to_edge` pass lowers `target` to core ATen ops.

    Ops only torch's wider table decomposes (often into `prims`) do not count:
    `to_edge` keeps them, as the user's op beats one they never wrote."""
    return target in _to_edge_table()


def outside_op_set(target: Any) -> bool:
    """An op the Edge dialect admits only with a kernel for it: a custom op, or
    a non-view ATen op that is not core and has no decomposition into core ops
    (as ExecuTorch's `_core_aten_ops_exception_list` admits ops by hand)."""
    if is_quantize_op(target):
        return False
    if is_custom_op(target):
        return True
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "aten" and \
        not target.is_view and not is_edge_op(target) and not has_decomposition(target)
