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

    This registers the op with the compiler only. The interpreter gets a kernel
    for it from `exirc.compiler.install_backend_kernels` (which compiling and
    `exirc run --plugin` call): `out_kernel` if given, else the kernel it
    already has for it (exirc's own ops, `exirc.runtime.kernels.exirc_ops`), else one
    that runs the pattern and copies its result into `out`. Python API users who
    bind their own ops call that function before running a program that uses them."""
    parsed = torch._C.parse_schema(schema)

    def bind(pattern: Callable[..., Any]) -> BackendOp:
        op = BackendOp(parsed.name, pattern, parsed, out_kernel)
        REGISTRY[f"{parsed.name}.{parsed.overload_name}"] = op
        return op

    return bind


def registered_kernel_names() -> frozenset[str]:
    return frozenset(REGISTRY)


# --------------------------------------------------------------------------
# Fusions shipped with exirc.
# --------------------------------------------------------------------------

aten = torch.ops.aten

# The runtime has its own copy (exirc.runtime.kernels.exirc_ops, with the op's kernel):
# the compiler may not import the runtime. tests/backend checks they agree.
ADDMM_RELU_SCHEMA = ("exirc::addmm_relu.out(Tensor self, Tensor mat1, Tensor mat2, *, "
                     "Tensor(a!) out) -> Tensor(a!)")


@bind_pattern_to_op(ADDMM_RELU_SCHEMA)  # its kernel: exirc.runtime.kernels.exirc_ops
def addmm_relu(bias: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """relu(bias + mat1 @ mat2): a linear layer and its activation, one pass over memory."""
    return aten.relu.default(aten.addmm.default(bias, mat1, mat2))


# ATen's own linear: its kernel (`aten::linear.out`) is on every target's kernel
# list, ExecuTorch's portable library included, so the runtime resolves torch's
# op and checks its arguments at load with torch's meta kernel, as for any ATen op.
LINEAR_SCHEMA = ("aten::linear.out(Tensor input, Tensor weight, Tensor? bias=None, *, "
                 "Tensor(a!) out) -> Tensor(a!)")


@bind_pattern_to_op(LINEAR_SCHEMA)  # its kernel: torch's, resolved by the runtime's allowlist
def linear(input: torch.Tensor, weight: torch.Tensor,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """input @ weight.T (+ bias) with `weight` as stored, [out_features, in_features]:
    the kernel hands BLAS the transposed view, so no copy of the weight is made."""
    transposed = aten.permute_copy.default(weight, [1, 0])
    if bias is None:
        return aten.mm.default(input, transposed)
    return aten.addmm.default(bias, input, transposed)
