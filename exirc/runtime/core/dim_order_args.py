"""The dim-order copies' `dim_order` arguments, checked at load.

ExecuTorch's `dim_order_ops::_to_dim_order_copy.out`, `_clone_dim_order.out`
and `_empty_dim_order.out` name the layout of their out by a dim order, an
argument no reader check covers (a tensor's own `dim_order` is checked when
the file is decoded). It must be a permutation of the out's dimensions and
agree with the layout the file gives the out: the kernels lay a resized out
out in this order, and keep a static out's own layout. The out's sizes are
those of what is copied (or the `size` argument), as `meta_shapes` checks for
ATen ops, which have no meta kernel for these.
"""

from __future__ import annotations

from exirc.errors import FormatError
from exirc.runtime.core.kernel_arguments import CallArguments
from exirc.runtime.core.values import Values
from exirc.serialize import program as P

_COPIES = frozenset({"dim_order_ops::_to_dim_order_copy.out",
                     "dim_order_ops::_clone_dim_order.out"})
_EMPTY = "dim_order_ops::_empty_dim_order.out"


def check_dim_order_call(call: CallArguments, values: Values, where: str) -> None:
    """Refuse a dim-order op whose dim order or out does not fit what it writes."""
    name = call.kernel.name
    if name not in _COPIES and name != _EMPTY:
        return
    named = dict(zip((arg.name for arg in call.kernel.schema.arguments), call.args))
    out = values.evalues[named["out"]]
    if not isinstance(out, P.Tensor):
        return  # not a tensor: argument_kinds refuses it
    rank = len(out.sizes)  # fixed even when the sizes are not
    source = "size" if name == _EMPTY else "self"
    sizes, fixed = _written_sizes(values, named[source])
    if sizes is not None and len(sizes) != rank:
        raise FormatError(f"argument 'out' (value {named['out']}) has {rank} dimensions, but "
                          f"argument {source!r} (value {named[source]}) has {len(sizes)}",
                          field=where)
    order = _ints(values, named["dim_order"])
    if order is not None and sorted(order) != list(range(rank)):
        raise FormatError(f"argument 'dim_order' {order} is not a permutation of the {rank} "
                          "dimensions of argument 'out'", field=where)
    if order is not None and order != (out.dim_order or list(range(rank))):
        raise FormatError(f"argument 'dim_order' {order} is not the dim order of argument "
                          f"'out' (value {named['out']}), {out.dim_order}", field=where)
    if fixed and _static(out) and list(out.sizes) != sizes:
        raise FormatError(f"argument 'out' (value {named['out']}) has sizes {out.sizes}, but "
                          f"the operator writes {sizes}", field=where)


def _written_sizes(values: Values, index: int) -> tuple[list[int] | None, bool]:
    """The sizes the op gives its out, from the tensor it copies or its `size`
    list, and whether they are fixed at load (not a dynamic shape)."""
    evalue = values.evalues[index]
    if isinstance(evalue, P.Tensor):
        return list(evalue.sizes), _static(evalue)
    sizes = _ints(values, index)
    return sizes, sizes is not None


def _ints(values: Values, index: int) -> list[int] | None:
    """The ints of IntList value `index`; None if absent or known only at run time."""
    evalue = values.evalues[index]
    if not isinstance(evalue, P.IntList) or index in values.written:
        return None
    if any(item in values.written for item in evalue.items):
        return None
    found = [values.env[item] for item in evalue.items]
    return found if all(isinstance(i, int) for i in found) else None


def _static(value: P.EValue) -> bool:
    return isinstance(value, P.Tensor) and \
        value.shape_dynamism == P.TensorShapeDynamism.STATIC
