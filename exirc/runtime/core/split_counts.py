"""How many tensors a split or an unbind makes, checked before a meta kernel makes them.

`split_copy.Tensor_out` and `unbind_copy.int_out` make one tensor per piece
of a dimension, and torch's kernels (meta ones included) make every piece
before comparing their number with the outs given: a hostile file's input of
a billion rows split by one would cost minutes and gigabytes at load. The
count is simple arithmetic on sizes, so it is checked here first, and a file
whose out list has another length is refused with what the count should be.

Other ops that return lists make as many tensors as a list in the file has
items (`split_with_sizes`), so a meta kernel costs what the file does.
Any other list-making op is not run on meta tensors (`meta_shapes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exirc.errors import FormatError

# name -> (pieces from the meta arguments, or None when the meta kernel should
# judge the arguments: it refuses bad ones before making any piece)
_SPLITS = ("split", "split_copy", "unsafe_split")
_UNBINDS = ("unbind", "unbind_copy")


def _split_pieces(arguments: list[Any]) -> int | None:
    size = _dim_size(arguments[0], arguments[2] if len(arguments) > 2 else 0)
    split = arguments[1]
    if size is None or not isinstance(split, int) or split <= 0:
        return None
    return max(1, -(-size // split))


def _unbind_pieces(arguments: list[Any]) -> int | None:
    return _dim_size(arguments[0], arguments[1] if len(arguments) > 1 else 0)


def _dim_size(tensor: Any, dim: Any) -> int | None:
    shape = getattr(tensor, "shape", None)
    if shape is None or not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        return None
    return int(shape[dim])


COUNTED: dict[str, Callable[[list[Any]], int | None]] = {
    **{f"aten::{name}.{overload}": _split_pieces for name in _SPLITS
       for overload in ("Tensor", "Tensor_out")},
    **{f"aten::{name}.{overload}": _unbind_pieces for name in _UNBINDS
       for overload in ("int", "int_out")},
}
"""Ops whose number of results is arithmetic on their arguments."""

LIST_SIZED = frozenset({
    "aten::split_with_sizes.default", "aten::split_with_sizes_copy.default",
    "aten::split_with_sizes_copy.out", "aten::unsafe_split_with_sizes.default",
    "aten::unsafe_split_with_sizes.out",
})
"""Ops that make one tensor per item of a list in the file."""


def check_count(name: str, arguments: list[Any], declared: int, label: str,
                where: str) -> bool:
    """Whether a meta kernel may run op `name` on `arguments` without making
    more tensors than the file declares; refuses a count the file gets wrong."""
    if name in LIST_SIZED:
        return True
    pieces = COUNTED.get(name)
    if pieces is None:
        return False
    count = pieces(arguments)
    if count is not None and count != declared:
        raise FormatError(f"{label} has {declared} tensors, but the operator makes {count} "
                          "from these arguments", field=where)
    return True
