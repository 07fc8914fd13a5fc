"""Custom operators with no out overload, called functionally into planned memory.

Every kernel call of a program writes into memory it is given. A custom op
that defines an out overload (`mylib::scale.out(Tensor x, float f, *,
Tensor(a!) out) -> Tensor(a!)`, as ExecuTorch requires of custom ops) runs
as that, like any ATen op, and the program then runs on ExecuTorch's runtime
too when a kernel for it is registered there. `torch.library.custom_op`
defines only the functional overload, so for such an op the out-variant
conversion writes a `FunctionalCall`:

    %scale = call_function[target=mylib::scale(into out)](args = (%x, 3.0), kwargs = {out: %alloc})

For planning it is an out-variant (its `_schema` is the op's with an out per
result), so the result gets planned memory like any other. The emitter
writes a KernelCall of the functional op itself, `mylib::scale`, whose
argument list ends with the result's planned tensor: exirc's runtime calls
the kernel registered for `mylib::scale` (`exirc run --plugin`) and copies
the tensor it returns into that memory. ExecuTorch's runtime has no such
calls: a program that must run there needs the op's `.out` overload.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


@dataclass(frozen=True, eq=False)
class FunctionalCall:
    """`op` called functionally, its results copied into the `out` arguments."""

    op: torch._ops.OpOverload
    _schema: torch._C.FunctionSchema  # op's arguments plus an out per result

    # The emitter passes the outs as the call's result slots, not as arguments.
    outs_are_results: ClassVar[bool] = True

    @property
    def kernel_name(self) -> tuple[str, str]:
        """The operator the program calls: the functional op."""
        overload = self.op._overloadname  # ExecuTorch names a default overload by none
        return self.op._schema.name, "" if overload == "default" else overload

    @property
    def out_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self._schema.arguments if a.is_out)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outs = [kwargs.pop(name) for name in self.out_names]
        results = self.op(*args, **kwargs)
        results = list(results) if isinstance(results, (tuple, list)) else [results]
        for out, result in zip(outs, results):
            if out.shape != result.shape:
                out.resize_(result.shape)
            out.copy_(result)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self) -> str:
        return f"{self.op}(into out)"

    # torch.fx names a call target by its __name__ in generated code.
    __name__ = property(lambda self: repr(self))


@functools.cache
def functional_call(op: torch._ops.OpOverload) -> FunctionalCall | None:
    """The FunctionalCall of `op`, or None when its results cannot be planned
    tensors: it returns something else than tensors, or aliases or writes an
    argument."""
    schema = op._schema
    if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
        return None
    if any(a.alias_info is not None for a in (*schema.arguments, *schema.returns)):
        return None
    taken = {a.name for a in schema.arguments}
    names = ["out"] if len(schema.returns) == 1 else \
        [f"out{i}" for i in range(len(schema.returns))]
    if taken & set(names):
        return None
    letters = "abcdefghijklmnopqrstuvwxyz"
    if len(names) > len(letters):
        return None
    outs = ", ".join(f"Tensor({letters[i]}!) {name}" for i, name in enumerate(names))
    returns = [f"Tensor({letters[i]}!)" for i in range(len(names))]
    head = str(schema).rsplit(") -> ", 1)[0]  # "mylib::scale(Tensor x, float f"
    separator = "" if not schema.arguments else ", "
    star = "" if any(a.kwarg_only for a in schema.arguments) else "*, "
    returned = returns[0] if len(returns) == 1 else f"({', '.join(returns)})"
    try:
        out_schema = torch._C.parse_schema(f"{head}{separator}{star}{outs}) -> {returned}")
    except RuntimeError:
        return None
    return FunctionalCall(op, out_schema)
