"""Meta calls whose answer is known without running torch's meta kernel.

`meta_shapes` checks each call by running its op on meta tensors. For most
ATen ops torch's meta kernel is Python (`torch._refs`, `torch._decomp`), and
the first call to one imports `torch._dynamo` and sympy: over a second, more
than everything else it takes to load and run a small program. Yet for the
ops below, when every tensor has one floating dtype, what the meta kernel
checks is a few lines: that shapes broadcast, that matrices chain, that a
dim is in range.

A rule answers one question only: does the meta kernel accept these
arguments and leave the out exactly as the file declares it (same sizes,
same dtype)? When it is sure of "yes", the meta kernel need not run. In
every other case (another dtype, sizes that do not fit, an argument the rule
does not know) the meta kernel runs as before, and refuses with its own
message. So no check is weaker: a file is refused exactly when it was
before, with the same message. `tests/runtime/test_meta_rules.py` holds the
rules to that, against torch's meta kernels, over many shapes and dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

Sizes = tuple[int, ...]
Rule = Callable[[Sequence[Any]], Sizes | None]
"""Takes the schema's arguments without the out (meta tensors and plain
values); gives the sizes the op makes, or None when it is not sure the meta
kernel accepts them."""

_FLOATING = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})


def accepts(op_name: str, arguments: Sequence[Any]) -> bool:
    """Whether a rule knows that the meta kernel of `op_name` (an ATen `.out`
    overload, as `OpOverload.name()` spells it) accepts `arguments` (in schema
    order, the out last) and leaves the out as it is."""
    rule = _RULES.get(op_name)
    if rule is None or not arguments:
        return False
    out = arguments[-1]
    if not isinstance(out, torch.Tensor) or out.dtype not in _FLOATING:
        return False
    inputs = arguments[:-1]
    if any(isinstance(value, torch.Tensor) and value.dtype != out.dtype for value in inputs):
        return False
    return rule(inputs) == tuple(out.shape)


def _number(value: Any) -> bool:
    """A Python int or float (not a bool, whose promotion differs, nor complex)."""
    return type(value) in (int, float)


def _tensors(values: Sequence[Any]) -> bool:
    return all(isinstance(value, torch.Tensor) for value in values)


def _broadcast(first: Sizes, second: Sizes) -> Sizes | None:
    """The sizes two shapes broadcast to, or None if they do not."""
    rank = max(len(first), len(second))
    sizes = []
    for a, b in zip((1,) * (rank - len(first)) + first, (1,) * (rank - len(second)) + second):
        if a != b and a != 1 and b != 1:
            return None
        sizes.append(b if a == 1 else a)
    return tuple(sizes)


def _same_shape(args: Sequence[Any]) -> Sizes | None:
    """(self): relu, exp, ... keep their input's shape."""
    return tuple(args[0].shape) if len(args) == 1 and _tensors(args) else None


def _elementwise(args: Sequence[Any]) -> Sizes | None:
    """(self, other[, alpha]): self and other broadcast; alpha is a number."""
    if len(args) < 2 or not (_tensors(args[:2]) and all(_number(a) for a in args[2:])):
        return None
    return _broadcast(tuple(args[0].shape), tuple(args[1].shape))


def _with_scalar(args: Sequence[Any]) -> Sizes | None:
    """(self, Scalar other[, alpha]): the shape of self."""
    if len(args) < 2 or not (_tensors(args[:1]) and all(_number(a) for a in args[1:])):
        return None
    return tuple(args[0].shape)


def _mm(args: Sequence[Any]) -> Sizes | None:
    """(self [n, k], mat2 [k, m]) -> [n, m]."""
    if len(args) != 2 or not _tensors(args) or args[0].dim() != 2 or args[1].dim() != 2:
        return None
    (n, k), (k2, m) = args[0].shape, args[1].shape
    return (n, m) if k == k2 else None


def _bmm(args: Sequence[Any]) -> Sizes | None:
    """(self [b, n, k], mat2 [b, k, m]) -> [b, n, m]."""
    if len(args) != 2 or not _tensors(args) or args[0].dim() != 3 or args[1].dim() != 3:
        return None
    (b, n, k), (b2, k2, m) = args[0].shape, args[1].shape
    return (b, n, m) if b == b2 and k == k2 else None


def _addmm(args: Sequence[Any]) -> Sizes | None:
    """(self, mat1 [n, k], mat2 [k, m], beta, alpha) -> [n, m]; self broadcasts to it."""
    if len(args) != 5 or not (_tensors(args[:1]) and _number(args[3]) and _number(args[4])):
        return None
    product = _mm(args[1:3])
    if product is None or _broadcast(tuple(args[0].shape), product) != product:
        return None
    return product


def _softmax(args: Sequence[Any]) -> Sizes | None:
    """(self, dim, half_to_float=False): the shape of self; dim within it."""
    if len(args) != 3 or not _tensors(args[:1]) or type(args[1]) is not int \
            or args[2] is not False:
        return None
    rank = max(args[0].dim(), 1)
    return tuple(args[0].shape) if -rank <= args[1] < rank else None


def _clone(args: Sequence[Any]) -> Sizes | None:
    """(self, memory_format=None): the shape of self."""
    return _same_shape(args[:1]) if len(args) == 2 and args[1] is None else None


def _permute_copy(args: Sequence[Any]) -> Sizes | None:
    """(self, dims): self's sizes in the order of dims, a permutation of its dims."""
    if len(args) != 2 or not _tensors(args[:1]) or not isinstance(args[1], list):
        return None
    rank, dims = args[0].dim(), args[1]
    if any(type(d) is not int or not -rank <= d < rank for d in dims):
        return None
    order = [d % rank for d in dims] if rank else []
    if sorted(order) != list(range(rank)):
        return None
    return tuple(args[0].shape[d] for d in order)


def _view_copy(args: Sequence[Any]) -> Sizes | None:
    """(self, size): a contiguous self, to sizes of as many elements (none inferred)."""
    if len(args) != 2 or not _tensors(args[:1]) or not isinstance(args[1], list):
        return None
    size = args[1]
    if any(type(s) is not int or s < 0 for s in size) or not args[0].is_contiguous():
        return None
    return tuple(size) if math.prod(size) == args[0].numel() else None


_RULES: dict[str, Rule] = {
    **{f"aten::{name}.out": _same_shape for name in (
        "relu", "sigmoid", "tanh", "exp", "neg", "abs", "sqrt", "rsqrt", "log", "sin", "cos",
        "erf")},
    **{f"aten::{name}.out": _elementwise for name in (
        "add", "sub", "mul", "div", "maximum", "minimum")},
    **{f"aten::{name}.Scalar_out": _with_scalar for name in ("add", "sub", "mul", "div")},
    "aten::mm.out": _mm,
    "aten::bmm.out": _bmm,
    "aten::addmm.out": _addmm,
    "aten::_softmax.out": _softmax,
    "aten::_log_softmax.out": _softmax,
    "aten::clone.out": _clone,
    "aten::permute_copy.out": _permute_copy,
    "aten::view_copy.out": _view_copy,
}
"""The ATen `.out` ops that have a rule, and the rule."""
