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
before, with the same message.

The same rules serve code that runs torch ops on meta tensors to infer
shapes (the XNNPACK delegates' shape check): within `KnownResults`, a
functional call a rule knows returns a new tensor of the sizes, dtype and
(contiguous) strides its meta kernel would return, an in-place one returns
self, and every other call runs as usual. `tests/runtime/kernels/test_meta_rules.py`
holds the rules to both, against torch's meta kernels, over many shapes,
layouts and dtypes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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
    rule = _OUT_RULES.get(op_name)
    if rule is None or not arguments or _common_dtype(arguments) is None:
        return False
    out = arguments[-1]
    return isinstance(out, torch.Tensor) and rule(arguments[:-1]) == tuple(out.shape)


def known_result(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
                 ) -> torch.Tensor | None:
    """What `op(*args, **kwargs)` returns on meta tensors, when a rule knows:
    a new contiguous tensor for a functional op, self for an in-place one;
    None when no rule is sure (run the op)."""
    name = op.name()
    in_place = name in _IN_PLACE_RULES
    rule, any_layout = (_IN_PLACE_RULES if in_place else _RESULT_RULES).get(name, (None, ()))
    arguments = _in_schema_order(op, args, kwargs) if rule is not None else None
    if rule is None or arguments is None:
        return None
    dtype = _common_dtype(arguments)
    if dtype is None or not in_place and any(
            isinstance(value, torch.Tensor) and value.stride() != _contiguous(value.shape)
            for position, value in enumerate(arguments) if position not in any_layout):
        return None
    sizes = rule(arguments)
    if sizes is None:
        return None
    if in_place:
        return arguments[0] if sizes == tuple(arguments[0].shape) else None
    return torch.empty(sizes, dtype=dtype, device="meta")


class KnownResults(TorchDispatchMode):
    """Within it, the ATen calls `known_result` knows are answered without
    their meta kernels; every other call runs as usual."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo,
        # which imports torch._dynamo on the first call: the very second this
        # mode saves. Nothing compiles within it (it serves shape checks).
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        known = known_result(func, args, kwargs) \
            if isinstance(func, torch._ops.OpOverload) else None
        return func(*args, **kwargs) if known is None else known


def _contiguous(sizes: Sizes) -> tuple[int, ...]:
    """The strides of a new tensor of these sizes (torch.empty's). A tensor
    torch calls contiguous may have others, on dims of size 1 or when it is
    empty, and the meta kernels lay their results out like their inputs."""
    strides = []
    step = 1
    for size in reversed(sizes):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _common_dtype(arguments: Sequence[Any]) -> torch.dtype | None:
    """The floating dtype every tensor has, if they are all meta tensors of one
    (the first argument is a tensor); else None."""
    if not arguments or not isinstance(arguments[0], torch.Tensor):
        return None
    dtype = arguments[0].dtype
    for value in arguments:
        if isinstance(value, torch.Tensor) and (value.dtype != dtype or not value.is_meta):
            return None
    return dtype if dtype in _FLOATING else None


def _in_schema_order(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
                     ) -> list[Any] | None:
    """The call's arguments as the schema lists them, defaults filled in; None
    if they do not fit it (torch says why)."""
    schema = op._schema.arguments
    positional = [arg for arg in schema if not arg.kwarg_only]
    if len(args) > len(positional) or set(kwargs) - {arg.name for arg in schema}:
        return None
    found = []
    for position, arg in enumerate(schema):
        if position < len(args) and not arg.kwarg_only:
            found.append(args[position])
        elif arg.name in kwargs:
            found.append(kwargs[arg.name])
        elif arg.has_default_value():
            found.append(arg.default_value)
        else:
            return None
    return found


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


def _clamp(args: Sequence[Any]) -> Sizes | None:
    """(self, min=None, max=None): the shape of self; min and max numbers, not both None."""
    if len(args) != 3 or not _tensors(args[:1]) or args[1] is None and args[2] is None:
        return None
    if not all(bound is None or _number(bound) for bound in args[1:]):
        return None
    return tuple(args[0].shape)


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


_UNARY = ("relu", "sigmoid", "tanh", "exp", "neg", "abs", "sqrt", "rsqrt", "log", "sin", "cos",
          "erf")
_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
_WITH_SCALAR = ("add", "sub", "mul", "div")

_OUT_RULES: dict[str, Rule] = {
    **{f"aten::{name}.out": _same_shape for name in _UNARY},
    **{f"aten::{name}.out": _elementwise for name in _BINARY},
    **{f"aten::{name}.Scalar_out": _with_scalar for name in _WITH_SCALAR},
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

_RESULT_RULES: dict[str, tuple[Rule, tuple[int, ...]]] = {
    **{f"aten::{name}": (_same_shape, ()) for name in _UNARY},
    **{f"aten::{name}": (_elementwise, ()) for name in ("maximum", "minimum")},
    **{f"aten::{name}.Tensor": (_elementwise, ()) for name in ("add", "sub", "mul", "div")},
    **{f"aten::{name}.Scalar": (_with_scalar, ()) for name in _WITH_SCALAR},
    "aten::clamp": (_clamp, ()),
    # The product of two matrices is a new contiguous tensor, however they are laid out.
    "aten::mm": (_mm, (0, 1)),
    "aten::bmm": (_bmm, (0, 1)),
    "aten::addmm": (_addmm, (1, 2)),
    "aten::_softmax": (_softmax, ()),
    "aten::_log_softmax": (_softmax, ()),
    "aten::clone": (_clone, ()),
    "aten::permute_copy": (_permute_copy, (0,)),
    "aten::view_copy": (_view_copy, ()),
}
"""The functional ATen ops that have a rule: the rule, and the positions of
the tensors that may have any layout (the others must be contiguous, so that
the result is, as the meta kernel makes it)."""

_IN_PLACE_RULES: dict[str, tuple[Rule, tuple[int, ...]]] = {
    "aten::relu_": (_same_shape, ()),
    "aten::clamp_": (_clamp, ()),
}
"""The in-place ATen ops that have a rule (they return self, of any layout)."""
