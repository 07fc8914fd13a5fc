"""Running a compiled XNNPACK graph: the delegate's hot path.

`execute` binds the delegate's arguments to the graph's external inputs (by
external id, as ExecuTorch's runtime does), runs the compiled closures over
a fresh copy of the value table (constants already in it), and writes each
external output into its argument, resizing it first when its shape changed
(ExecuTorch's runtime resizes the outputs of a graph whose input shapes
vary). Inputs may differ from the blob's dims where the graph allows (a
payload with dynamic dims declares their upper bounds, and every value is
resized from the call's inputs), never in rank or dtype. Whatever goes wrong in a call is
raised as an `InputError` naming the node: the graph was checked at init,
so what fails now is what the call gave it.
"""

from __future__ import annotations

from typing import Any

import torch

from exirc.errors import ExircError, InputError
from exirc.runtime.delegates.xnnpack.compile import CompiledGraph, External


def execute(graph: CompiledGraph, args: list[Any]) -> None:
    """Run `graph` on `args` (its inputs, then its outputs, which are written in place)."""
    if len(args) != graph.num_args:
        raise InputError(f"the XNNPACK delegate takes {graph.num_args} arguments (inputs "
                         f"then outputs), got {len(args)}")
    env = graph.template.copy()
    for external in graph.inputs:
        env[external.slot] = _input(external, args[external.arg])
    i = -1
    try:
        for i, op in enumerate(graph.ops):  # noqa: B007 (i names the failing node)
            op(env)
        for external in graph.outputs:
            _write(external, args[external.arg], env[external.slot])
    except ExircError:
        raise
    except Exception as error:  # noqa: BLE001 (torch's checks, on shapes init did not see)
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        at = graph.labels[i] if 0 <= i < len(graph.ops) else "its outputs"
        raise InputError(f"the XNNPACK delegate failed at {at}: {type(error).__name__}: "
                         f"{detail}",
                         hint="the delegate's inputs have shapes its graph cannot take; "
                              "`exirc inspect` shows the shapes the program was made for"
                         ) from error


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _input(external: External, arg: Any) -> torch.Tensor:
    """A delegate input, checked: a tensor of the value's dtype and rank."""
    if not isinstance(arg, torch.Tensor):
        raise InputError(f"XNNPACK delegate argument {external.arg} is a "
                         f"{type(arg).__name__}, not a tensor")
    if arg.dtype != external.dtype:
        raise InputError(f"XNNPACK delegate input {external.arg} has dtype {_name(arg.dtype)}, "
                         f"its graph takes {_name(external.dtype)}")
    if arg.dim() != len(external.dims):
        if arg.dim() == 0 and external.dims == (1,):
            return arg.reshape(1)  # XNNPACK has no 0-d tensors: scalars are [1]
        raise InputError(f"XNNPACK delegate input {external.arg} has shape {list(arg.shape)}, "
                         f"its graph takes rank {len(external.dims)} ({list(external.dims)})")
    return arg


def _write(external: External, out: Any, result: torch.Tensor) -> None:
    """Write one output into its argument, taking the result's shape."""
    if not isinstance(out, torch.Tensor) or out.dtype != external.dtype:
        what = f"a {_name(out.dtype)} tensor" if isinstance(out, torch.Tensor) \
            else f"a {type(out).__name__}"
        raise InputError(f"XNNPACK delegate output {external.arg} is {what}, its graph "
                         f"writes {_name(external.dtype)}")
    if out.shape != result.shape:
        if out.dim() == 0 and result.shape == (1,):
            result = result.reshape(())
        else:
            out.resize_(result.shape)
    out.copy_(result)
