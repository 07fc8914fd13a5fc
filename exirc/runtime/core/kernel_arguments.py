"""A KernelCall's tensor arguments as the load-time checks see them.

For each schema argument that holds tensors (a tensor, an optional tensor,
a list of tensors or of optional tensors): which tensor values it names,
and whether the kernel writes them (`Tensor(a!)`: outs, and the `self` of an
in-place op) or only reads them. Functional ops also have result slots after
their arguments. The checks in `overlap` and `meta_shapes` work from this.

Kinds are not this module's to judge (`binding` refuses a tensor where an int
belongs, with its own message): a call whose values do not have the kinds its
schema asks for is given no description here, and is left to binding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exirc.runtime.kernels.registry import Kernel
from exirc.serialize import program as P

# Schema types (as `str(argument.real_type)` spells them) that hold tensors,
# and the value kinds each accepts; `Optional[...]` accepts a Null too.
_TENSOR_KINDS: dict[str, tuple[type, ...]] = {
    "Tensor": (P.Tensor,),
    "List[Tensor]": (P.TensorList,),
    "List[Optional[Tensor]]": (P.OptionalTensorList, P.TensorList),
}


@dataclass(frozen=True)
class TensorArgument:
    """One schema argument that holds tensors, and the tensor values it names."""

    name: str
    value: int  # the KernelCall's value for the argument (a tensor or a list)
    items: tuple[int, ...]  # the tensor values it names; -1 for an optional list's None
    is_list: bool
    written: bool  # the kernel writes these tensors (an out, or an in-place self)
    is_out: bool  # written and not read (an out argument)

    def tensors(self) -> list[tuple[int, int]]:
        """(position, value) of each tensor the argument names."""
        return [(position, item) for position, item in enumerate(self.items) if item >= 0]

    def label(self, position: int) -> str:
        """`argument 'out'`, or `item 2 of argument 'tensors'` for a list's item."""
        if not self.is_list:
            return f"argument {self.name!r}"
        return f"item {position} of argument {self.name!r}"


@dataclass(frozen=True)
class CallArguments:
    """What the checks need to know about one KernelCall."""

    kernel: Kernel
    args: tuple[int, ...]  # the call's values, schema arguments first
    tensors: tuple[TensorArgument, ...]
    results: tuple[int, ...]  # the slots a functional op's results go to

    @property
    def functional(self) -> bool:
        """Whether the kernel returns new values into result slots (not through outs)."""
        return bool(self.kernel.schema.returns) and not any(t.written for t in self.tensors)

    def result_pairs(self, evalues: Sequence[P.EValue]) -> list[tuple[Any, int]] | None:
        """(schema return, slot) for each result of a functional op, as binding
        stores them (several tensor results may share one TensorList slot); None
        when the slots do not fit the returns (binding refuses that)."""
        returns = list(self.kernel.schema.returns)
        slots = list(self.results)
        if len(returns) > 1 and len(slots) == 1:
            only = evalues[slots[0]]
            if isinstance(only, P.TensorList):
                slots = list(only.items)
        if len(slots) != len(returns):
            return None
        return list(zip(returns, slots))


def call_arguments(kernel: Kernel, args: Sequence[int],
                   evalues: Sequence[P.EValue]) -> CallArguments | None:
    """The description of `kernel(args)`, or None if its values do not have the
    kinds its schema asks for (left to binding, which says what is wrong)."""
    schema_args = kernel.schema.arguments
    if len(args) < len(schema_args):
        return None
    tensors = []
    for arg, index in zip(schema_args, args):
        try:
            described = _tensor_argument(arg, index, evalues)
        except _WrongKind:
            return None
        if described is not None:
            tensors.append(described)
    return CallArguments(kernel, tuple(args), tuple(tensors), tuple(args[len(schema_args):]))


class _WrongKind(Exception):
    """A value is not of the kind its schema argument takes."""


def _tensor_argument(arg: Any, index: int,
                     evalues: Sequence[P.EValue]) -> TensorArgument | None:
    """The argument's description; None if it holds no tensors."""
    type_text = str(arg.real_type)
    optional = type_text.startswith("Optional[")
    kinds = _TENSOR_KINDS.get(type_text[9:-1] if optional else type_text)
    if kinds is None:
        return None
    evalue = evalues[index]
    if optional and isinstance(evalue, P.Null):
        return None
    if not isinstance(evalue, kinds):
        raise _WrongKind
    if isinstance(evalue, P.Tensor):
        items: tuple[int, ...] = (index,)
    else:
        assert isinstance(evalue, (P.TensorList, P.OptionalTensorList))
        # An optional list's None is -1 or a Null value (kept as -1, so that
        # positions stay the list's); the rest must be tensors.
        items = tuple(-1 if item < 0 or isinstance(evalues[item], P.Null) else item
                      for item in evalue.items)
        if any(item >= 0 and not isinstance(evalues[item], P.Tensor) for item in items):
            raise _WrongKind
    written = arg.alias_info is not None and arg.alias_info.is_write
    return TensorArgument(arg.name, index, items, not isinstance(evalue, P.Tensor), written,
                          written and arg.is_out)
