"""Binding a KernelCall to its kernel and arguments, once, at load.

Each KernelCall becomes a closure holding the kernel (`exirc.runtime.kernels.registry`)
and its argument objects: tensors are fixed objects whose memory and shape
change in place, so a call at run time does no lookups and no string work.
Only values written at run time (sizes computed by prim ops) are read from
the value table per call. The loader has checked each call's values against
the schema (`argument_kinds`: counts, kinds, fixed list lengths, result
slots); binding checks the rest of what a file could get wrong: outs that
would write into constants, enum codes (dtypes, memory formats), and lists
written at run time, when they are read, since a kernel trusts their length.

A call with only fixed arguments (the common case: an out variant) is also
offered as an `action`: a `functools.partial` of the kernel, which Python
calls with no frame of its own. Its result is the kernel's (not None), so
only loops that ignore results (`exirc.runtime.straight_line`) use it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from exirc.errors import FormatError
from exirc.runtime.core import list_lengths
from exirc.runtime.core.arenas import TORCH_DTYPES, alias
from exirc.runtime.core.argument_kinds import LIST_CATEGORIES, Signature, category
from exirc.runtime.core.values import Values
from exirc.runtime.errors import ExecutionError
from exirc.runtime.kernels import fast_entries
from exirc.runtime.kernels.registry import Kernel, copy_into, is_dispatcher_call
from exirc.serialize import program as P

Call = Callable[[], None]
Action = Callable[[], Any]
"""A call whose result means nothing: run it for its effect."""


class Bound(NamedTuple):
    """A bound KernelCall: `call` returns None (a step of the jump-following loop);
    `action`, when there is one, does the same work faster but returns the
    kernel's result (see the module docstring)."""

    call: Call
    action: Action | None

_MEMORY_FORMATS = (torch.contiguous_format, torch.preserve_format, torch.channels_last,
                   torch.channels_last_3d)


def bind(kernel: Kernel, args: Sequence[int], values: Values, where: str) -> Bound:
    """The KernelCall `kernel(args)` as a closure that runs it with no lookups.

    Its values must have passed `argument_kinds.check_calls`."""
    schema = kernel.schema
    count = len(schema.arguments)
    fn = kernel.fn
    positional: list[Any] = []
    dispatched = is_dispatcher_call(fn)
    if dispatched:
        # Call the dispatcher's entry point directly: one layer fewer per call.
        assert isinstance(fn, functools.partial)
        positional, fn = list(fn.args), fn.func
        entry = fast_entries.entry_for(kernel.name, positional[0])
        if entry is not None:  # torch's Python binding: faster, and it fills defaults too
            positional, fn = [], entry
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
          store: Callable[[Any], None] | None) -> Bound:
    if not fills and not resets and store is None:
        def call() -> None:  # the common case: an out-variant with fixed arguments
            fn(*args, **kwargs)
        # The partial's arguments are fixed now: nothing here changes at run time.
        return Bound(call, functools.partial(fn, *args, **kwargs))

    def call_with_updates() -> None:
        for container, key, get in fills:
            container[key] = get()
        for tensor in resets:
            tensor.resize_(0)
        result = fn(*args, **kwargs)
        if store is not None:
            store(result)
    return Bound(call_with_updates, None)


def _argument(arg: Any, index: int, values: Values,
              where: str) -> tuple[Any, Callable[[], Any] | None]:
    """The argument object for value `index`, or a getter when it changes at run time."""
    evalue = values.evalues[index]
    kind, optional = category(arg)
    env = values.env
    convert = _ENUM_CONVERTERS.get(kind or "")
    if index in values.written:
        if convert is not None:
            return None, lambda: convert(env[index], where)
        if kind in LIST_CATEGORIES:
            return None, _checked_list(arg, index, env, optional)
        return None, lambda: env[index]
    if isinstance(evalue, P.IntList) and any(i in values.written for i in evalue.items):
        items = list(evalue.items)
        return None, lambda: [env[i] for i in items]
    value = env[index]
    if convert is not None and value is not None:
        value = convert(value, where)
    return value, None


def _checked_list(arg: Any, index: int, env: list[Any],
                  optional: bool) -> Callable[[], Any]:
    """A getter for a list written at run time (a move into it) that refuses, as an
    ExecutionError, anything but a list of a length the argument takes."""
    def get() -> Any:
        value = env[index]
        if value is None and optional:
            return value
        if not isinstance(value, list):
            raise ExecutionError(f"argument {arg.name!r} expects {arg.real_type}, but value "
                                 f"{index} holds a {type(value).__name__} when it is read")
        if not list_lengths.fits(arg, len(value)):
            raise ExecutionError(f"argument {arg.name!r} expects "
                                 f"{list_lengths.fixed_length(arg)} items "
                                 f"({list_lengths.declared_type(arg)}), but value {index} "
                                 f"holds {len(value)} when it is read")
        return value
    return get


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
    targets = Signature(kernel).result_slots(slots, values.evalues, lambda: where)
    if not targets:
        return None
    returns = kernel.schema.returns
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
