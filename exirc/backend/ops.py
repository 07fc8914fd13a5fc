"""The backend op registry: each op bound to the pattern it stands for.

A backend op is a name the runtime resolves (e.g. `exirc::addmm_relu`) plus
a pattern: an FX-traceable function of Edge ops. The pattern is the op's
reference implementation (calling the op runs it), the fusion pass finds it
in graphs, and tracing it recovers the subgraph the op replaced. Ops are
plain Python callables, not torch.library ops, so registering ours never
clashes with another library registering the same namespace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from exirc.runtime.exirc_ops import ADDMM_RELU_SCHEMA

# Kernel for the out-variant: fn(*args, out) writes the result into out.
OutKernel = Callable[..., Any]


@dataclass(frozen=True, eq=False)
class BackendOp:
    """One backend op; `_schema` is its out-variant's, as the emitter needs."""

    qualified_name: str             # "exirc::addmm_relu"
    pattern: Callable[..., Any]     # reference implementation, traceable
    _schema: torch._C.FunctionSchema  # the out-variant schema
    out_kernel: OutKernel | None = None

    @property
    def kernel_name(self) -> tuple[str, str]:
        return self.qualified_name, self._schema.overload_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if k not in self.out_names}
        return self.pattern(*args, **kwargs)

    @property
    def out_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self._schema.arguments if a.is_out)

    def __repr__(self) -> str:
        return f"{self.qualified_name}.{self._schema.overload_name}"

    # torch.fx names a call target by its __name__ in generated code.
    __name__ = property(lambda self: repr(self))


REGISTRY: dict[str, BackendOp] = {}


def bind_pattern_to_op(schema: str, *, out_kernel: OutKernel | None = None
                       ) -> Callable[[Callable[..., Any]], BackendOp]:
    """Decorator: bind the decorated pattern to the op whose out-variant
    schema is `schema`, e.g.
    "exirc::addmm_relu.out(Tensor self, Tensor mat1, Tensor mat2, *, Tensor(a!) out)
    -> Tensor(a!)".

    The runtime runs the op with `out_kernel` if given, else with the kernel it
    already has for it (exirc's own ops, `exirc.runtime.exirc_ops`), else by
    running the pattern and copying its result into `out`."""
    parsed = torch._C.parse_schema(schema)

    def bind(pattern: Callable[..., Any]) -> BackendOp:
        op = BackendOp(parsed.name, pattern, parsed, out_kernel)
        REGISTRY[f"{parsed.name}.{parsed.overload_name}"] = op
        _register_runtime_kernel(op, schema)
        return op

    return bind


# Ops whose runtime kernel a binding registered (a pattern or an out_kernel):
# binding them again replaces it, whereas a kernel the runtime ships stays.
_BOUND_KERNELS: set[str] = set()


def _register_runtime_kernel(op: BackendOp, schema: str) -> None:
    from exirc.runtime.kernels import KERNELS, copy_into, operator_key

    name, overload = op.kernel_name
    known = KERNELS.find(name, overload)
    if known is not None and op.out_kernel is None and known.name not in _BOUND_KERNELS:
        return  # the runtime ships a kernel for it (exirc_ops, prim_ops)
    if op.out_kernel is not None:
        _BOUND_KERNELS.add(operator_key(name, overload))
        KERNELS.register(schema, op.out_kernel)
        return
    outs = op.out_names
    if len(outs) != 1:
        return  # no way to run the pattern into memory: the runtime reports it missing
    out_name, pattern = outs[0], op.pattern

    def run_pattern(*args: Any, **kwargs: Any) -> Any:
        out = kwargs.pop(out_name)
        copy_into(out, pattern(*args, **kwargs))
        return out

    _BOUND_KERNELS.add(operator_key(name, overload))
    KERNELS.register(schema, run_pattern)


def registered_kernel_names() -> frozenset[str]:
    return frozenset(REGISTRY)


# --------------------------------------------------------------------------
# Fusions shipped with exirc.
# --------------------------------------------------------------------------

aten = torch.ops.aten


@bind_pattern_to_op(ADDMM_RELU_SCHEMA)  # its kernel: exirc.runtime.exirc_ops
def addmm_relu(bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """relu(bias + mat1 @ mat2): a linear layer and its activation, one pass over memory."""
    return aten.relu.default(aten.addmm.default(bias, mat1, mat2))
