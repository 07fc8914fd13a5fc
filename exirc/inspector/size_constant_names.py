"""Names of stored constants in the size report: pluggable sources, tried in order.

First the names exirc's compiler stores beside the program
(`exirc.serialize.constant_names`: parameter names, and what folded constants
were computed from), then `extra_tensor_info.fully_qualified_name`, which
ExecuTorch writes for some tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exirc.serialize import constant_names, metadata
from exirc.serialize import program as P


@dataclass
class ConstantUse:
    """The first tensor value reading a stored buffer (constant or mutable data)."""

    method: str
    value: int
    tensor: P.Tensor
    user: str | None  # the first operator (or delegate) whose call uses it
    tensors: int = 1  # how many tensor values (in all methods) read the buffer


NameSource = Callable[[ConstantUse], "str | None"]


def fully_qualified_name(use: ConstantUse) -> str | None:
    extra = use.tensor.extra_tensor_info
    return extra.fully_qualified_name if extra is not None else None


DEFAULT_NAME_SOURCES: tuple[NameSource, ...] = (fully_qualified_name,)


def stored_names(program: P.Program) -> NameSource:
    """Names from the compiler's `exirc.serialize.constant_names` segment, if the file has one."""
    data = metadata.stored(program, constant_names.NAMED_DATA_KEY)
    names = constant_names.decode(data) if data is not None else {}

    def name(use: ConstantUse) -> str | None:
        listed = names.get(use.tensor.data_buffer_idx) if use.tensor.data_buffer_idx else None
        return " = ".join(listed) if listed else None
    return name


def constant_name(use: ConstantUse, sources: Sequence[NameSource]) -> str | None:
    for source in sources:
        name = source(use)
        if name:
            return name
    return None
