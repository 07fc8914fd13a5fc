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

from collections.abc import Mapping, Sequence
from typing import Any

from exirc.errors import FormatError
from exirc.runtime import list_lengths
from exirc.runtime.kernels import Kernel, operator_key
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


def category(arg: Any) -> tuple[str | None, bool]:
    """(what the schema argument `arg` expects, whether it is optional); the
    category is None for a type the interpreter does not check."""
    type_text = str(arg.real_type)
    optional = type_text.startswith("Optional[")
    return _CATEGORIES.get(type_text[9:-1] if optional else type_text), optional


def check_calls(plan: P.ExecutionPlan, kernels: Mapping[int, Kernel], where: str) -> None:
    """Refuse `plan` (FormatError) at its first KernelCall whose values do not fit
    its operator's schema; `where` names the plan (`execution_plan[0]`)."""
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            if isinstance(instr, P.KernelCall):
                op = plan.operators[instr.op_index]
                at = (f"{where}.chains[{c}].instructions[{i}] "
                      f"({operator_key(op.name, op.overload)})")
                check_call(kernels[instr.op_index], instr.args, plan.values, at)


def check_call(kernel: Kernel, args: Sequence[int], values: Sequence[P.EValue],
               where: str) -> None:
    """Refuse the KernelCall `kernel(args)` if its values do not fit the schema."""
    schema = kernel.schema
    count = len(schema.arguments)
    if len(args) < count:
        raise FormatError(f"{where} has {len(args)} arguments, but the operator takes {count}: "
                          f"{schema}")
    for arg, index in zip(schema.arguments, args):
        _check_argument(arg, index, values[index], f"{where}, argument {arg.name!r}")
    result_slots(kernel, args[count:], values, where)


def _check_argument(arg: Any, index: int, value: P.EValue, where: str) -> None:
    kind, optional = category(arg)
    if kind is not None:
        accepted = _ACCEPTS[kind] + ((P.Null,) if optional else ())
        if not isinstance(value, accepted):
            names = " or ".join(accepts.__name__ for accepts in accepted)
            raise FormatError(f"{where} expects {arg.real_type} (a {names} value), but value "
                              f"{index} is a {type(value).__name__}")
    if isinstance(value, _LISTS) and not list_lengths.fits(arg, len(value.items)):
        raise FormatError(f"{where} expects {list_lengths.fixed_length(arg)} items "
                          f"({list_lengths.declared_type(arg)}), but value {index}, "
                          f"{_article(type(value).__name__)}, has {len(value.items)}")


def _article(kind: str) -> str:
    return f"{'an' if kind[0] in 'AEIOU' else 'a'} {kind}"


def result_slots(kernel: Kernel, slots: Sequence[int], values: Sequence[P.EValue],
                 where: str) -> list[int]:
    """The values a functional op's results go to, one per result; none for an op
    that writes through its arguments (an out-variant, an in-place op).

    Several tensor results may go to one TensorList slot (ExecuTorch's form).
    Refuses slots that do not match the results in number or kind: a tensor
    result needs a Tensor slot, a scalar one a slot of its kind.
    """
    schema = kernel.schema
    if not schema.returns or any(a.alias_info is not None and a.alias_info.is_write
                                 for a in schema.arguments):
        return []
    returns = list(schema.returns)
    targets = list(slots)
    if len(returns) > 1 and len(targets) == 1:
        only = values[targets[0]]
        if isinstance(only, P.TensorList):
            targets = list(only.items)
    if len(targets) != len(returns):
        raise FormatError(f"{where} has {len(slots)} result slots for the operator's "
                          f"{len(returns)} results: {schema}")
    for n, (ret, slot) in enumerate(zip(returns, targets)):
        kind, optional = category(ret)
        accepted = _ACCEPTS.get(kind or "", ())
        if accepted and not optional and not isinstance(values[slot], accepted):
            raise FormatError(f"{where} puts result {n} ({ret.real_type}) into value {slot}, "
                              f"a {type(values[slot]).__name__}")
    return targets
