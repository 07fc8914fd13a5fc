"""Kernels: what runs each KernelCall, found by operator name and bound at load.

A kernel is a Python callable plus its operator's schema (torch's
`FunctionSchema`). The schema is what turns a KernelCall's flat argument list
(every schema argument in order, out arguments included, then the return
values) into a call: positional arguments, keyword-only ones and outs, and
the slots where a functional op's results go.

Lookup order for `namespace::name.overload`:
  1. kernels registered by name: the ExecuTorch prim ops (`prim_ops`), exirc's
     own backend ops (`exirc_ops`, e.g. `exirc::addmm_relu.out`), and users'
     own (`@register_kernel`, or a plugin module that uses it, such as one
     binding a backend op to a pattern);
  2. any ATen operator, straight from torch's op registry and its schema, so
     every `aten::*.out` op runs without an entry here.

Binding happens once, at load: each KernelCall becomes a closure holding the
kernel and its argument objects (tensors are fixed objects whose memory and
shape change in place), so a call at run time does no lookups and no string
work. Only Ints written at run time (sizes computed by prim ops) are read
from the value table per call.
"""

from __future__ import annotations

import functools
import re
from collections import ChainMap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import torch

from exirc.errors import FormatError, UsageError
from exirc.runtime.arenas import TORCH_DTYPES, alias
from exirc.runtime.exirc_ops import OWN_KERNELS
from exirc.serialize import program as P

KernelFn = TypeVar("KernelFn", bound=Callable[..., Any])
Call = Callable[[], None]

# Operator names come from untrusted files and are used with getattr on
# torch.ops: plain identifiers only, never dunders.
_IDENTIFIER = re.compile(r"(?!__)[A-Za-z_][A-Za-z0-9_]*")

_MEMORY_FORMATS = (torch.contiguous_format, torch.preserve_format, torch.channels_last,
                   torch.channels_last_3d)


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
    ATen."""

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

    def find(self, name: str, overload: str) -> Kernel | None:
        kernel = self._kernels.get(operator_key(name, overload))
        return kernel or aten_kernel(name, overload)


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
        op = _torch_op(spec)
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


def aten_kernel(name: str, overload: str) -> Kernel | None:
    """Any ATen operator, from torch's own registry: its schema and a direct call."""
    if not name.startswith("aten::"):
        return None
    key = operator_key(name, overload)
    op = _torch_op(key)
    if op is None:
        return None
    try:
        return _view_copy_kernel(key, op) or Kernel(key, op._schema, _direct_call(op))
    except RuntimeError:  # a name torch.ops accepts lazily but cannot find a schema for
        return None


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
    view = _torch_op(f"aten::{name.removesuffix('_copy')}."
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


def _torch_op(key: str) -> torch._ops.OpOverload | None:
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


def _is_dispatcher_call(fn: Callable[..., Any]) -> bool:
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


# ---------------------------------------------------------------------------
# Binding a KernelCall to its arguments, once, at load.
# ---------------------------------------------------------------------------

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


@dataclass
class Values:
    """What binding needs to know about a method's values."""

    env: list[Any]  # the value table the run loop reads and writes
    evalues: list[P.EValue]  # the program's values, for kinds and metadata
    written: frozenset[int]  # values other than tensors that change at run time


def bind(kernel: Kernel, args: Sequence[int], values: Values, where: str) -> Call:
    """The KernelCall `kernel(args)` as a closure that runs it with no lookups."""
    schema = kernel.schema
    count = len(schema.arguments)
    if len(args) < count:
        raise FormatError(f"{where} has {len(args)} arguments, but the operator takes {count}: "
                          f"{schema}")
    fn = kernel.fn
    positional: list[Any] = []
    dispatched = _is_dispatcher_call(fn)
    if dispatched:
        # Call the dispatcher's entry point directly: one layer fewer per call.
        assert isinstance(fn, functools.partial)
        positional, fn = list(fn.args), fn.func
    keywords: dict[str, Any] = {}
    fills: list[tuple[Any, Any, Callable[[], Any]]] = []  # (container, key, getter) per call
    resets: list[torch.Tensor] = []  # dynamic-shape outs, emptied so torch resizes them quietly
    for arg, index in zip(schema.arguments, args):
        value, getter = _argument(arg, index, values, f"{where}, argument {arg.name!r}")
        if arg.alias_info is not None and arg.alias_info.is_write:
            resets += _check_output(arg, index, values, f"{where}, argument {arg.name!r}")
        if not arg.kwarg_only:
            container: Any = positional
            key: Any = len(positional)
            positional.append(value)
        elif dispatched and getter is None and _is_default(arg, value) and not arg.is_out:
            continue  # the dispatcher fills in defaults; passing them costs time
        else:
            container, key = keywords, arg.name
            keywords[arg.name] = value
        if getter is not None:
            fills.append((container, key, getter))
    store = _result_writer(kernel, args[count:], values, where)
    return _call(fn, positional, keywords, fills, resets, store)


def _call(fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any],
          fills: list[tuple[Any, Any, Callable[[], Any]]], resets: list[torch.Tensor],
          store: Callable[[Any], None] | None) -> Call:
    if not fills and not resets and store is None:
        def call() -> None:  # the common case: an out-variant with fixed arguments
            fn(*args, **kwargs)
        return call

    def call_with_updates() -> None:
        for container, key, get in fills:
            container[key] = get()
        for tensor in resets:
            tensor.resize_(0)
        result = fn(*args, **kwargs)
        if store is not None:
            store(result)
    return call_with_updates


def _argument(arg: Any, index: int, values: Values,
              where: str) -> tuple[Any, Callable[[], Any] | None]:
    """The argument object for value `index`, or a getter when it changes at run time."""
    evalue = values.evalues[index]
    type_text = str(arg.real_type)
    optional = type_text.startswith("Optional[")
    category = _CATEGORIES.get(type_text[9:-1] if optional else type_text)
    if category is not None:
        accepted = _ACCEPTS[category] + ((P.Null,) if optional else ())
        if not isinstance(evalue, accepted):
            names = " or ".join(kind.__name__ for kind in accepted)
            raise FormatError(f"{where} expects {type_text} (a {names} value), but value "
                              f"{index} is a {type(evalue).__name__}")
    env = values.env
    convert = _ENUM_CONVERTERS.get(category or "")
    if index in values.written:
        if convert is not None:
            return None, lambda: convert(env[index], where)
        return None, lambda: env[index]
    if isinstance(evalue, P.IntList) and any(i in values.written for i in evalue.items):
        items = list(evalue.items)
        return None, lambda: [env[i] for i in items]
    value = env[index]
    if convert is not None and value is not None:
        value = convert(value, where)
    return value, None


def _check_output(arg: Any, index: int, values: Values, where: str) -> list[torch.Tensor]:
    """Outs must be writable (not constants); dynamic ones are emptied before each call."""
    evalue = values.evalues[index]
    items = evalue.items if isinstance(evalue, (P.TensorList, P.OptionalTensorList)) else [index]
    resets = []
    for item in items:
        tensor = values.evalues[item] if item >= 0 else None
        if not isinstance(tensor, P.Tensor):
            continue
        if tensor.data_buffer_idx and tensor.allocation_info is None:
            raise FormatError(f"{where} writes into value {item}, a constant tensor")
        if tensor.shape_dynamism != P.TensorShapeDynamism.STATIC and arg.is_out:
            resets.append(values.env[item])
    return resets


def _is_default(arg: Any, value: Any) -> bool:
    if not arg.has_default_value():
        return False
    default = arg.default_value
    if value is None or default is None:
        return value is None and default is None
    simple = (bool, int, float, str)
    return isinstance(value, simple) and type(value) is type(default) and value == default


def _dtype(code: int, where: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[P.ScalarType(code)]
    except (ValueError, KeyError):
        raise FormatError(f"{where}: {code} is not a dtype the interpreter supports") from None


def _memory_format(code: int, where: str) -> torch.memory_format:
    if not 0 <= code < len(_MEMORY_FORMATS):
        raise FormatError(f"{where}: {code} is not a memory format")
    return _MEMORY_FORMATS[code]


def _layout(code: int, where: str) -> torch.layout:
    if code != 0:
        raise FormatError(f"{where}: layout {code} is not supported (only strided, 0)")
    return torch.strided


_ENUM_CONVERTERS: dict[str, Callable[[Any, str], Any]] = {
    "dtype": _dtype, "memory format": _memory_format, "layout": _layout,
}


# ---------------------------------------------------------------------------
# Where a functional op's results go.
# ---------------------------------------------------------------------------


def _result_writer(kernel: Kernel, slots: Sequence[int], values: Values,
                   where: str) -> Callable[[Any], None] | None:
    """How to store what the kernel returns, or None when nothing needs storing.

    Ops that write their outputs through arguments (out variants, in-place ops)
    return aliases of those arguments: nothing to store. A functional op's
    results go to the slots after its arguments: scalars into the value table,
    tensors into the slot's tensor (a returned alias, like a view, makes the
    slot share its memory; a new tensor is copied into the slot's planned bytes).
    """
    schema = kernel.schema
    if not schema.returns or any(a.alias_info is not None and a.alias_info.is_write
                                 for a in schema.arguments):
        return None
    returns = list(schema.returns)
    targets = list(slots)
    if len(returns) > 1 and len(targets) == 1:
        only = values.evalues[targets[0]]
        if isinstance(only, P.TensorList):
            targets = list(only.items)  # ExecuTorch's form for several tensor results
    if len(targets) != len(returns):
        raise FormatError(f"{where} has {len(slots)} result slots for the operator's "
                          f"{len(returns)} results: {schema}")
    writers = [_slot_writer(ret, slot, values) for ret, slot in zip(returns, targets)]
    if len(writers) == 1:
        return writers[0]
    multiple = writers

    def write_all(results: Any) -> None:
        for write, result in zip(multiple, results):
            write(result)
    return write_all


def _slot_writer(ret: Any, slot: int, values: Values) -> Callable[[Any], None]:
    evalue = values.evalues[slot]
    env = values.env
    if not isinstance(evalue, P.Tensor):
        def write_value(result: Any) -> None:
            env[slot] = result
        return write_value
    target: torch.Tensor = env[slot]
    if ret.alias_info is not None or evalue.allocation_info is None:
        def share(result: torch.Tensor) -> None:
            alias(target, result)
        return share

    def copy(result: torch.Tensor) -> None:
        copy_into(target, result)
    return copy


# exirc's own backend ops, registered here so that the default registry has them
# whoever imports it first (`exirc_ops` cannot import the registry: a cycle).
for _spec, _fn in OWN_KERNELS.items():
    KERNELS.register(_spec, _fn)
