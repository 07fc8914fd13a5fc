"""Kernels: what runs each KernelCall, found by operator name.

A kernel is a Python callable plus its operator's schema (torch's
`FunctionSchema`). The schema is what turns a KernelCall's flat argument list
(every schema argument in order, out arguments included, then the return
values) into a call; `exirc.runtime.core.binding` does that, once, at load.

Lookup order for `namespace::name.overload`:
  1. kernels registered by name: the ExecuTorch prim ops (`prim_ops`), exirc's
     own backend ops (`exirc_ops`, e.g. `exirc::addmm_relu.out`), ExecuTorch's
     quantized kernel library (`quantized_kernels`, `quantized_decomposed::*`),
     and users' own (`@register_kernel`, or a plugin module that uses it, such as one
     binding a backend op to a pattern);
  2. an ATen operator on the runtime's allowlist (`allowlist`: the targets'
     kernel lists), straight from torch's op registry and its schema, so
     every listed `aten::*.out` op runs without an entry here. Other ATen
     operators are refused unless the caller opts in with `any_aten=True`,
     which trusts the program: many ATen kernels do not check what a file
     can get wrong, and crash the process on it.
"""

from __future__ import annotations

import functools
import re
from collections import ChainMap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import torch

from exirc.errors import UsageError
from exirc.runtime.kernels.allowlist import is_allowlisted
from exirc.runtime.kernels.data_sized_outs import GUARDS
from exirc.runtime.kernels.exirc_ops import OWN_KERNELS
from exirc.runtime.kernels.quantized import QUANTIZED_KERNELS

KernelFn = TypeVar("KernelFn", bound=Callable[..., Any])

# Operator names come from untrusted files and are used with getattr on
# torch.ops: plain identifiers only, never dunders.
_IDENTIFIER = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Kernel:
    """A callable and the schema that says how a KernelCall's arguments map onto it."""

    name: str  # as programs spell it: "aten::add.out", "executorch_prim::et_view.default"
    schema: torch._C.FunctionSchema
    fn: Callable[..., Any]


def operator_key(name: str, overload: str) -> str:
    """One spelling per operator: the empty overload is `default`, as in torch.ops."""
    return f"{name}.{overload or 'default'}"


class KernelRegistry:
    """Kernels by operator name. Lookups fall back to the parent registry, then to
    the allowlisted ATen operators."""

    def __init__(self, parent: KernelRegistry | None = None) -> None:
        # Lookups fall through to the parent's entries, never writes.
        self._kernels: ChainMap[str, Kernel] = (
            ChainMap({}) if parent is None else parent._kernels.new_child())

    @overload
    def register(self, spec: str) -> Callable[[KernelFn], KernelFn]: ...

    @overload
    def register(self, spec: str, fn: KernelFn) -> KernelFn: ...

    def register(self, spec: str, fn: KernelFn | None = None) -> Any:
        """Register `fn` for the operator `spec`; usable as a decorator.

        `spec` is a schema, `"mylib::scale.out(Tensor x, float f, *, Tensor(a!) out)
        -> Tensor(a!)"`, or just a name (`"aten::add.out"`) when torch already knows
        the operator and its schema. Registering a name again replaces its kernel.
        """
        if fn is None:
            return functools.partial(self.register, spec)
        schema = parse_schema(spec)
        key = operator_key(schema.name, schema.overload_name)
        self._kernels[key] = Kernel(key, schema, fn)
        return fn

    def operator_names(self) -> frozenset[str]:
        """The operators registered here (and in parents), spelled as a target's
        kernel list spells them: `ns::name` for a default overload."""
        return frozenset(key.removesuffix(".default") for key in self._kernels)

    def find(self, name: str, overload: str, *, any_aten: bool = False) -> Kernel | None:
        """The kernel for `name.overload`: a registered one, else an allowlisted
        ATen operator from torch's registry; None if there is neither.

        `any_aten=True` resolves every ATen operator torch has. That trusts the
        program: operators off the allowlist may trust what a hostile file gets
        wrong (an index out of range, an inconsistent size), and some crash the
        process on it.
        """
        key = operator_key(name, overload)
        kernel = self._kernels.get(key)
        if kernel is not None:
            return kernel
        if not (any_aten or is_allowlisted(key)):
            return None
        return aten_kernel(name, overload)


KERNELS = KernelRegistry()
"""The default registry: exirc's own ops (registered below), the prim ops (once
the loader imports `prim_ops`), and whatever users register."""


@overload
def register_kernel(spec: str) -> Callable[[KernelFn], KernelFn]: ...


@overload
def register_kernel(spec: str, fn: KernelFn) -> KernelFn: ...


def register_kernel(spec: str, fn: KernelFn | None = None) -> Any:
    """Register a kernel in the default registry (see `KernelRegistry.register`).

        @register_kernel("mylib::scale.out(Tensor x, float f, *, Tensor(a!) out) -> Tensor(a!)")
        def scale_out(x, f, *, out):
            return torch.mul(x, f, out=out)
    """
    if fn is None:
        return KERNELS.register(spec)
    return KERNELS.register(spec, fn)


def parse_schema(spec: str) -> torch._C.FunctionSchema:
    if "(" not in spec:
        op = torch_op(spec)
        if op is None:
            raise UsageError(f"torch does not know the operator {spec!r}, so its kernel needs "
                             "a schema", hint='register it as "ns::name.overload(Tensor x, *, '
                                              'Tensor(a!) out) -> Tensor(a!)"')
        return op._schema
    head, _, rest = spec.partition("(")
    # torch spells the default overload as none at all.
    head = head.strip().removesuffix(".default")
    try:
        return torch._C.parse_schema(f"{head}({rest}")
    except RuntimeError as error:
        raise UsageError(f"cannot parse the kernel schema {spec!r}: "
                         f"{str(error).splitlines()[0]}") from None


def outside_allowlist(name: str, overload: str) -> bool:
    """Whether torch has this ATen operator but the runtime's allowlist leaves it
    out (so only `find(..., any_aten=True)` resolves it)."""
    return (name.startswith("aten::") and not is_allowlisted(operator_key(name, overload))
            and aten_kernel(name, overload) is not None)


def aten_kernel(name: str, overload: str) -> Kernel | None:
    """Any ATen operator, from torch's own registry: its schema and a direct call.
    No allowlist here: `KernelRegistry.find` applies it."""
    if not name.startswith("aten::"):
        return None
    key = operator_key(name, overload)
    op = torch_op(key)
    if op is None:
        return None
    try:
        kernel = _view_copy_kernel(key, op) or Kernel(key, op._schema, _direct_call(op))
    except RuntimeError:  # a name torch.ops accepts lazily but cannot find a schema for
        return None
    guard = GUARDS.get(key)
    return kernel if guard is None else Kernel(key, kernel.schema, guard(kernel.fn))


def _view_copy_kernel(key: str, op: torch._ops.OpOverload) -> Kernel | None:
    """`aten::X_copy.<o>_out` run as the view `aten::X.<o>` and one copy into out.

    ATen implements these out-variants by materialising the whole result and
    then copying it into `out`. A view costs nothing, so this saves an
    allocation and a copy; and since `out` is resized before anything is
    written, a size the plan cannot hold (a corrupted `expand_copy` size, say)
    fails on the out's capacity instead of allocating gigabytes first.
    Splits (a list of outs) stay with ATen, whose kernel copies them faster
    than one strided copy per part.
    """
    name, _, overload = key.partition("::")[2].partition(".")
    if not name.endswith("_copy"):
        return None
    view = torch_op(f"aten::{name.removesuffix('_copy')}."
                     f"{'default' if overload == 'out' else overload.removesuffix('_out')}")
    schema = op._schema
    outs = [arg for arg in schema.arguments if arg.is_out]
    inputs = [arg for arg in schema.arguments if not arg.is_out]
    if (view is None or len(outs) != 1 or str(outs[0].real_type) != "Tensor"
            or _signature(inputs) != _signature(view._schema.arguments)):
        return None
    out_name = outs[0].name
    call_view = _direct_call(view)

    def view_then_copy(*args: Any, **kwargs: Any) -> Any:
        out = kwargs.pop(out_name)
        copy_into(out, call_view(*args, **kwargs))
        return out
    return Kernel(key, schema, view_then_copy)


def _signature(arguments: Sequence[Any]) -> list[tuple[str, str, bool]]:
    return [(arg.name, str(arg.real_type), arg.kwarg_only) for arg in arguments]


def copy_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """Copy `source` into `target`'s memory, taking its shape (within capacity)."""
    if target.shape != source.shape:
        target.resize_(source.shape)
    target.copy_(source)


def torch_op(key: str) -> torch._ops.OpOverload | None:
    """torch's overload for `namespace::name.overload`, or None (checked identifiers only)."""
    namespace, _, rest = key.partition("::")
    base, _, overload = rest.partition(".")
    overload = overload or "default"
    if not all(_IDENTIFIER.fullmatch(part) for part in (namespace, base, overload)):
        return None
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), base), overload)
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


def is_dispatcher_call(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is a `_direct_call`: the dispatcher's entry point and an op handle."""
    boxed = getattr(torch._C, "_dispatch_call_boxed", None)
    return (isinstance(fn, functools.partial) and fn.func is boxed and boxed is not None
            and not fn.keywords)


def _direct_call(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """Call the operator through the dispatcher with no Python layers on the way.

    `OpOverload.__call__` adds a Python frame and re-parses the arguments
    against every overload's schema; the boxed call goes straight to the
    kernel registered for this one overload.
    """
    boxed = getattr(torch._C, "_dispatch_call_boxed", None)
    if boxed is None:  # an older or newer torch without it: the public path
        return op._op
    return functools.partial(boxed, op._handle)


# exirc's own backend ops, registered here so that the default registry has them
# whoever imports it first (`exirc_ops` cannot import the registry: a cycle).
for _spec, _fn in {**OWN_KERNELS, **QUANTIZED_KERNELS}.items():
    KERNELS.register(_spec, _fn)
