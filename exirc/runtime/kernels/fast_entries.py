"""Faster ways into a few common ATen kernels: torch's own Python bindings.

An ATen KernelCall goes through `torch._C._dispatch_call_boxed` with the
operator's handle (`kernels._direct_call`): generic, but it boxes each
argument onto the dispatcher's stack. torch's Python binding of the same
function (`torch.add`) parses its arguments straight into the typed call,
about 0.4 µs less per call on tiny tensors: a third of an add's whole cost.

The binding picks its overload from the arguments' Python types, though, so
it stands in only for the operators listed here: out variants whose overload
it picks for the argument kinds a checked KernelCall passes (tensors where
the schema says Tensor, numbers where it says Scalar, keyword-only
arguments by name). tests/runtime/kernels/test_fast_entries.py checks each one under
a dispatch mode: the same overload runs, with the same results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_FUNCTIONS = torch._C._VariableFunctions
_NN = torch._C._nn

# Operator key -> (module of the binding, its name).
_ENTRIES: dict[str, tuple[Any, str]] = {
    **{f"aten::{name}.out": (_FUNCTIONS, name) for name in (
        "add", "sub", "mul", "div", "addmm", "mm", "bmm", "baddbmm", "tanh", "sigmoid",
        "exp", "log", "neg", "abs", "sqrt", "rsqrt", "maximum", "minimum", "_softmax", "cat",
        "cumsum", "logical_and")},
    **{f"aten::{name}.out": (_NN, name) for name in ("gelu", "hardtanh", "leaky_relu")},
    "aten::pow.Tensor_Scalar_out": (_FUNCTIONS, "pow"),
    "aten::bitwise_and.Tensor_out": (_FUNCTIONS, "bitwise_and"),
    "aten::lt.Scalar_out": (_FUNCTIONS, "lt"),
    "aten::gt.Scalar_out": (_FUNCTIONS, "gt"),
    "aten::where.self_out": (_FUNCTIONS, "where"),
    "aten::eq.Tensor_out": (_FUNCTIONS, "eq"),
    "aten::le.Tensor_out": (_FUNCTIONS, "le"),
    "aten::ne.Scalar_out": (_FUNCTIONS, "ne"),
    "aten::ge.Scalar_out": (_FUNCTIONS, "ge"),
}


def operator_keys() -> frozenset[str]:
    """The operators that have a faster entry (for tests and benchmarks)."""
    return frozenset(_ENTRIES)


def entry_for(key: str, handle: Any) -> Callable[..., Any] | None:
    """torch's Python binding that runs operator `key` (`aten::add.out`), or None.

    `handle` is the dispatcher handle the kernel would be called with: the
    binding replaces it only when it is this very operator's, so a kernel
    registered under an ATen name keeps its own callable."""
    found = _ENTRIES.get(key)
    if found is None:
        return None
    base, _, overload = key.partition("::")[2].partition(".")
    op = getattr(getattr(torch.ops.aten, base, None), overload, None)
    if op is None or getattr(op, "_handle", None) is not handle:
        return None
    module, name = found
    entry: Callable[..., Any] | None = getattr(module, name, None)
    return entry
