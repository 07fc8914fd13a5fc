"""Fixed-length list arguments: `int[4]`, `bool[3]`, `SymInt[2]` in a schema.

A schema type `T[N]` says the kernel reads N items, and ATen kernels index
them without checking: `reflection_pad2d_backward` given an empty `int[4]`
read past the list and took the process down. So a list a file passes as
`T[N]` must have exactly N items, with two exceptions torch's own schemas
make:

  * `T[1]` is no fixed length: torch means "one value or a list" by it, and
    a reduction's `int[1] dim` or `roll`'s `int[1] shifts` take any number;
  * an empty list where the schema's default is the empty list (pooling's
    `int[2] stride=[]`): the kernel reads it as it reads its default, "the
    same as the kernel size".

`binding` applies this at load, and to lists written at run time when they
are read.
"""

from __future__ import annotations

from typing import Any


def fixed_length(argument: Any) -> int | None:
    """The number of items the list argument `argument` (a torch schema
    `Argument`) must have, or None if any number will do."""
    length = argument.N
    return length if isinstance(length, int) and length >= 2 else None


def fits(argument: Any, length: int) -> bool:
    """Whether a list of `length` items may be passed as `argument`."""
    expected = fixed_length(argument)
    if expected is None or length == expected:
        return True
    return length == 0 and _defaults_to_empty(argument)


def declared_type(argument: Any) -> str:
    """`int[4]`: the argument's list type as the schema writes it."""
    text = str(argument.real_type)
    optional = text.startswith("Optional[")
    inner = text[len("Optional["):-1] if optional else text
    element = inner[len("List["):-1] if inner.startswith("List[") else inner
    return f"{element}[{argument.N}]{'?' if optional else ''}"


def _defaults_to_empty(argument: Any) -> bool:
    return bool(argument.has_default_value()) and argument.default_value == []
