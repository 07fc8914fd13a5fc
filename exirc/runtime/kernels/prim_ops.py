"""Kernels for the non-ATen operators that ExecuTorch-style programs contain.

  * `executorch_prim::*.Scalar`: arithmetic and comparisons on sizes known
    only at run time (SymInts), e.g. `mul.Scalar(%4, 2)` for `x.view(n * 2, -1)`.
    They read and write Int/Double/Bool values, never tensors.
  * `executorch_prim::et_view.default`: a view made at run time (the emitter
    elides static views; a dynamic one must alias its input with new sizes).
  * `executorch_prim::et_copy_index.tensor`: how `torch.map` and `scan` loops
    stack their per-iteration results: `copy_to[index] = copy_from`, growing
    `copy_to` along dim 0 to `index + 1` rows (within its planned capacity).
  * `aten::sym_size.int` and `aten::sym_numel`: sizes of a tensor as values.
  * `dim_order_ops::*`: ExecuTorch's copies that name a layout by dim order.

Schemas follow ExecuTorch's registrations (`executorch_prim_ops_registry.py`,
`dim_order_ops_registry.py`); the kernels are ours.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from exirc.runtime.kernels.registry import register_kernel
from exirc.runtime.tensor_layout import strides

Scalar = int | float | bool

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "floordiv": operator.floordiv,
    "truediv": operator.truediv,
    "sym_max": max,
    "sym_min": min,
}
_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq,
    "gt": operator.gt,
    "lt": operator.lt,
    "ge": operator.ge,
    "le": operator.le,
}
_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": operator.neg,
    "sym_float": float,
    "sym_int": int,
    "ceil": math.ceil,
    "round": round,
    "trunc": math.trunc,
}

for _name, _binary in _BINARY.items():
    register_kernel(f"executorch_prim::{_name}.Scalar(Scalar a, Scalar b) -> Scalar", _binary)
for _name, _compare in _COMPARISONS.items():
    register_kernel(f"executorch_prim::{_name}.Scalar(Scalar a, Scalar b) -> bool", _compare)
for _name, _unary in _UNARY.items():
    register_kernel(f"executorch_prim::{_name}.Scalar(Scalar a) -> Scalar", _unary)
register_kernel("executorch_prim::mod.Scalar(SymInt a, SymInt b) -> SymInt", operator.mod)
register_kernel("executorch_prim::sym_not.Scalar(Scalar a) -> bool", operator.not_)


@register_kernel("executorch_prim::sym_ite.Scalar(Scalar b, Scalar t, Scalar f) -> Scalar")
def sym_ite(condition: Scalar, if_true: Scalar, if_false: Scalar) -> Scalar:
    return if_true if condition else if_false


@register_kernel("aten::sym_size.int(Tensor self, int dim) -> SymInt")
def sym_size(tensor: torch.Tensor, dim: int) -> int:
    return tensor.size(dim)


@register_kernel("aten::sym_numel(Tensor self) -> SymInt")
def sym_numel(tensor: torch.Tensor) -> int:
    return tensor.numel()


@register_kernel("executorch_prim::et_view.default(Tensor(a) self, int[] size) -> Tensor(a)")
def et_view(tensor: torch.Tensor, size: list[int]) -> torch.Tensor:
    # The result is stored by aliasing (the schema's `(a)`): the slot's tensor
    # then shares `tensor`'s memory, as the planner intended.
    return tensor.view(size)


@register_kernel("executorch_prim::et_copy_index.tensor(Tensor(a!) copy_to, Tensor copy_from, "
                 "int index) -> ()")
def et_copy_index(copy_to: torch.Tensor, copy_from: torch.Tensor, index: int) -> None:
    if index < 0:
        raise IndexError(f"et_copy_index: index {index} is negative")
    # Growing row by row keeps earlier rows in place (dim 0 is outermost).
    copy_to.resize_((index + 1, *copy_from.shape))
    copy_to[index].copy_(copy_from)


def _copy_in_dim_order(tensor: torch.Tensor, dim_order: list[int] | None,
                       out: torch.Tensor) -> torch.Tensor:
    if out.shape != tensor.shape:  # a dynamic shape: lay the new size out in dim order
        out.resize_(tensor.shape)
        if dim_order:
            out.as_strided_(tensor.shape, strides(list(tensor.shape), dim_order))
    return out.copy_(tensor)


@register_kernel("dim_order_ops::_to_dim_order_copy.out(Tensor self, *, bool non_blocking=False, "
                 "int[]? dim_order=None, Tensor(a!) out) -> Tensor(a!)")
def to_dim_order_copy(tensor: torch.Tensor, *, out: torch.Tensor, non_blocking: bool = False,
                      dim_order: list[int] | None = None) -> torch.Tensor:
    return _copy_in_dim_order(tensor, dim_order, out)


@register_kernel("dim_order_ops::_clone_dim_order.out(Tensor self, *, bool non_blocking=False, "
                 "int[]? dim_order=None, Tensor(a!) out) -> Tensor(a!)")
def clone_dim_order(tensor: torch.Tensor, *, out: torch.Tensor, non_blocking: bool = False,
                    dim_order: list[int] | None = None) -> torch.Tensor:
    return _copy_in_dim_order(tensor, dim_order, out)


@register_kernel("dim_order_ops::_empty_dim_order.out(int[] size, *, int[]? dim_order=None, "
                 "Tensor(a!) out) -> Tensor(a!)")
def empty_dim_order(size: list[int], *, out: torch.Tensor,
                    dim_order: list[int] | None = None) -> torch.Tensor:
    if list(out.shape) != list(size):
        out.resize_(size)
        if dim_order:
            out.as_strided_(size, strides(list(size), dim_order))
    return out
