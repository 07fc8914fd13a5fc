"""Each KernelCall's values against its operator's schema: counts, kinds, list lengths.

The first check of a program's calls, made as soon as their kernels are
known and before any memory is allocated or any kernel (a meta kernel
included) sees an argument: a call must give every schema argument a value
of the kind the schema takes (a Tensor for `Tensor`, an IntList for
`int[]`, a Null only where the argument is optional), lists of a fixed
length (`int[4]`: `list_lengths`) exactly that many items, and a functional
op's results slots of the kinds it returns. The later checks
(`argument_checks`) and `binding` rely on this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from exirc.errors import FormatError
from exirc.runtime.core import list_lengths
from exirc.runtime.kernels.registry import Kernel, operator_key
from exirc.serialize import program as P

# What a schema argument expects, from its type as written in the schema.
_CATEGORIES = {
    "Tensor": "tensor", "List[Tensor]": "tensor list", "List[Optional[Tensor]]": "optional list",
    "int": "int", "List[int]": "int list", "float": "float", "List[float]": "float list",
    "bool": "bool", "List[bool]": "bool list", "number": "scalar", "str": "str",
    "ScalarType": "dtype", "MemoryFormat": "memory format", "Layout": "layout",
}

# The value kinds each category accepts (Null too when the argument is optional).
_ACCEPTS: dict[str, tuple[type, ...]] = {
    "tensor": (P.Tensor,), "tensor list": (P.TensorList,),
    "optional list": (P.OptionalTensorList, P.TensorList),
    "int": (P.Int,), "int list": (P.IntList,), "float": (P.Double, P.Int),
    "float list": (P.DoubleList,), "bool": (P.Bool,), "bool list": (P.BoolList,),
    "scalar": (P.Int, P.Double, P.Bool), "str": (P.String,),
    "dtype": (P.Int,), "memory format": (P.Int,), "layout": (P.Int,),
}

LIST_CATEGORIES = frozenset({"tensor list", "optional list", "int list", "float list",
                             "bool list"})
_LISTS = (P.IntList, P.DoubleList, P.BoolList, P.TensorList, P.OptionalTensorList)

Where = Callable[[], str]
"""Names the call in a message; only called when there is something wrong, as
most calls are fine and the words cost time."""


def category(arg: Any) -> tuple[str | None, bool]:
    """(what the schema argument `arg` expects, whether it is optional); the
    category is None for a type the interpreter does not check."""
    type_text = str(arg.real_type)
    optional = type_text.startswith("Optional[")
    return _CATEGORIES.get(type_text[9:-1] if optional else type_text), optional


class Signature:
    """What the calls of one kernel must look like, worked out once per kernel
    (reading a torch schema costs microseconds per argument)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        schema = kernel.schema
        # (argument, the value kinds it accepts or None if unchecked, its fixed length)
        self.arguments = [(arg, _accepted(arg), list_lengths.fixed_length(arg))
                          for arg in schema.arguments]
        functional = not any(a.alias_info is not None and a.alias_info.is_write
                             for a in schema.arguments)
        # (return, the slot kinds it accepts or None), for an op whose results need slots
        self.returns = [(ret, _accepted(ret)) for ret in schema.returns] if functional else []

    def check(self, args: Sequence[int], values: Sequence[P.EValue], where: Where) -> None:
        """Refuse the call `kernel(args)` (FormatError) if its values do not fit."""
        count = len(self.arguments)
        if len(args) < count:
            raise FormatError(f"{where()} has {len(args)} arguments, but the operator takes "
                              f"{count}: {self.kernel.schema}")
        for (arg, accepted, fixed), index in zip(self.arguments, args):
            value = values[index]
            if accepted is not None and not isinstance(value, accepted):
                names = " or ".join(kind.__name__ for kind in accepted)
                raise FormatError(f"{where()}, argument {arg.name!r} expects {arg.real_type} "
                                  f"(a {names} value), but value {index} is a "
                                  f"{type(value).__name__}")
            if fixed is not None and isinstance(value, _LISTS) \
                    and not list_lengths.fits(arg, len(value.items)):
                raise FormatError(f"{where()}, argument {arg.name!r} expects {fixed} items "
                                  f"({list_lengths.declared_type(arg)}), but value {index}, "
                                  f"{_article(type(value).__name__)}, has {len(value.items)}")
        self.result_slots(args[count:], values, where)

    def result_slots(self, slots: Sequence[int], values: Sequence[P.EValue],
                     where: Where) -> list[int]:
        """The values a functional op's results go to, one per result; none for an
        op that writes through its arguments (an out-variant, an in-place op).

        Several tensor results may go to one TensorList slot (ExecuTorch's form).
        Refuses slots that do not match the results in number or kind: a tensor
        result needs a Tensor slot, a scalar one a slot of its kind.
        """
        if not self.returns:
            return []
        targets = list(slots)
        if len(self.returns) > 1 and len(targets) == 1:
            only = values[targets[0]]
            if isinstance(only, P.TensorList):
                targets = list(only.items)
        if len(targets) != len(self.returns):
            raise FormatError(f"{where()} has {len(slots)} result slots for the operator's "
                              f"{len(self.returns)} results: {self.kernel.schema}")
        for n, ((ret, accepted), slot) in enumerate(zip(self.returns, targets)):
            if accepted is not None and not isinstance(values[slot], accepted):
                raise FormatError(f"{where()} puts result {n} ({ret.real_type}) into value "
                                  f"{slot}, a {type(values[slot]).__name__}")
        return targets


def check_calls(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel], where: str) -> None:
    """Refuse `plan` (FormatError) at its first KernelCall whose values do not fit
    its operator's schema; `where` names the plan (`execution_plan[0]`)."""
    signatures: dict[int, Signature] = {}
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            if not isinstance(instr, P.KernelCall):
                continue
            signature = signatures.get(instr.op_index)
            if signature is None:
                signature = signatures[instr.op_index] = Signature(kernels[instr.op_index])
            signature.check(instr.args, plan.values, functools.partial(_site, plan, where, c, i))


def _site(plan: P.ExecutionPlan, where: str, chain: int, index: int) -> str:
    """`execution_plan[0].chains[0].instructions[3] (aten::add.out)`, for messages."""
    instr = plan.chains[chain].instructions[index]
    assert isinstance(instr, P.KernelCall)
    op = plan.operators[instr.op_index]
    return (f"{where}.chains[{chain}].instructions[{index}] "
            f"({operator_key(op.name, op.overload)})")


def _accepted(arg: Any) -> tuple[type, ...] | None:
    """The value kinds a schema argument (or return) takes; None if unchecked."""
    kind, optional = category(arg)
    if kind is None:
        return None
    return _ACCEPTS[kind] + ((P.Null,) if optional else ())


def _article(kind: str) -> str:
    return f"{'an' if kind[0] in 'AEIOU' else 'a'} {kind}"
