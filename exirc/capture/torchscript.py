"""TorchScript archives -> ExportedProgram, through torch's own converter.

`torch._export.converter.TS2EPConverter` rewrites the TorchScript graph as
an FX graph (prim::If becomes torch.cond, a constant-trip prim::Loop is
unrolled) and traces it with torch.export. It refuses loops whose trip count
or condition is computed (`while i < int(n)`, `for _ in range(int(n))`,
`while x.sum() < 100`); those graphs are run node by node by
`torchscript_interpreter.TorchScriptProgram` instead, which makes such
loops `while_loop`s. Both need example inputs, which a TorchScript archive
does not keep. They come from, in this order:

  1. a file given with the archive (`load_model(spec, example_inputs_path=)`,
     `exirc compile --example-inputs FILE`): a .pt file holding a tuple of
     tensors (read with `torch.load(weights_only=True)`, so nothing but
     tensors is unpickled), a .npy (one input) or a .npz (its arrays in
     archive order, read by exirc's own non-trusting reader);
  2. the module's own `example_inputs` attribute, a tuple of tensors set in
     `__init__` before scripting (TorchScript saves it with the module);
  3. otherwise a `ModelError` says how to give them, including a model.py
     that does `model = torch.jit.load("m.pt")` and defines `example_inputs`
     (and `dynamic_shapes`) like any other model file.

The converter marks every input dimension dynamic (Dim.AUTO). exirc
compiles static shapes unless asked, so the converted program is exported
once more with the `dynamic_shapes` the user gave (None: static), which also
turns torch's pre-dispatch graph into the plain ATen dialect.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from exirc.capture.export_failures import export_error, quiet_torch
from exirc.capture.loaded_model import MAIN_METHOD, MethodSource, Warn
from exirc.capture.messages import describe, first_line
from exirc.capture.torchscript_control_flow import has_computed_loop, has_loop
from exirc.capture.torchscript_interpreter import TorchScriptProgram, exirc_error_in
from exirc.errors import ModelError, UsageError
from exirc.ir.source import display_path

if TYPE_CHECKING:
    from torch.export import ExportedProgram

_INPUTS_HINT = (
    "give the inputs with the archive (a .pt file holding a tuple of tensors, or a .npy/.npz), "
    "set `self.example_inputs = (...)` in the module's __init__ before scripting it, or write "
    'a model.py with `model = torch.jit.load("m.pt")` and `example_inputs = (...)`'
)


def load_torchscript(path: str, example_inputs_path: str | None, warn: Warn) -> MethodSource:
    """A TorchScript archive as a method whose program is already exported."""
    shown = display_path(path)
    jit_load: Callable[..., torch.jit.ScriptModule] = torch.jit.load  # (untyped in torch)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is, by torch
            module = jit_load(path, map_location="cpu")
    except Exception as e:
        raise ModelError(f"{shown}: cannot load the TorchScript archive: {first_line(e)}",
                         hint="save it again with torch.jit.save") from e
    if example_inputs_path is not None:
        inputs = read_example_inputs(example_inputs_path)
    else:
        inputs = _own_example_inputs(module, shown)
    if module.training:
        warn(f"{shown}: the TorchScript module is in training mode; compiling it in eval mode "
             "(call .eval() before saving it to silence this warning)")
        module.eval()
    exported = convert(module, inputs, origin=shown)
    return MethodSource(MAIN_METHOD, module, inputs, None, exported, shown)


def convert(module: torch.jit.ScriptModule, example_inputs: tuple[Any, ...],
            dynamic_shapes: Any = None, *, origin: str) -> ExportedProgram:
    """A scripted module -> an ATen-dialect program with the given dynamic shapes.

    torch's converter handles what it can; a loop it cannot unroll (its trip
    count or condition computed) is left to `TorchScriptProgram`, which
    makes it a while_loop, as is any loop in a graph the converter fails on.
    """
    graph = module.inlined_graph
    if has_computed_loop(graph):
        return _interpret(module, example_inputs, dynamic_shapes, origin)
    try:
        converted = _convert_with_torch(module, example_inputs, origin)
    except ModelError:
        if not has_loop(graph):
            raise
        return _interpret(module, example_inputs, dynamic_shapes, origin)
    return _export(converted, example_inputs, dynamic_shapes, origin)


def _convert_with_torch(module: torch.jit.ScriptModule, example_inputs: tuple[Any, ...],
                        origin: str) -> torch.nn.Module:
    from torch._export.converter import TS2EPConverter

    try:
        return TS2EPConverter(module, example_inputs).convert().module()
    except Exception as e:
        raise ModelError(
            f"{origin}: cannot convert the TorchScript module to an ExportedProgram: "
            f"{type(e).__name__}: {first_line(e)}",
            hint="torch's converter does not cover every TorchScript construct; export the "
                 "original nn.Module from a model.py instead") from e


def _interpret(module: torch.jit.ScriptModule, example_inputs: tuple[Any, ...],
               dynamic_shapes: Any, origin: str) -> ExportedProgram:
    """Export the graph run node by node: data-dependent loops become while_loops."""
    return _export(TorchScriptProgram(module, origin), example_inputs, dynamic_shapes, origin)


def _export(module: torch.nn.Module, example_inputs: tuple[Any, ...], dynamic_shapes: Any,
            origin: str) -> ExportedProgram:
    try:
        with quiet_torch():
            return torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes,
                                       strict=False)
    except Exception as e:
        ours = exirc_error_in(e)  # the interpreter's, naming the TorchScript line
        if ours is not None:
            raise ours from ours.__cause__  # not torch's wrapper around it
        raise export_error(e, origin, MAIN_METHOD, None) from e


def read_example_inputs(path: str) -> tuple[Any, ...]:
    """Example inputs from a .pt (tuple of tensors), .npy or .npz file."""
    shown = display_path(path)
    suffix = os.path.splitext(path)[1].lower()
    if not os.path.isfile(path):
        raise UsageError(f"{shown}: no such file", hint=_INPUTS_HINT)
    if suffix in (".npy", ".npz"):
        from exirc.serialize.npy import load_array, load_arrays

        arrays = [load_array(path)] if suffix == ".npy" else list(load_arrays(path).values())
        return tuple(torch.from_numpy(array) for array in arrays)
    if suffix not in (".pt", ".pth"):
        raise UsageError(f"{shown}: example inputs are read from a .pt, .npy or .npz file",
                         hint=_INPUTS_HINT)
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UsageError(f"{shown}: cannot read example inputs: {first_line(e)}",
                         hint="save them with torch.save((x, y), path)") from e
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise UsageError(f"{shown}: holds {describe(value)}, expected a tuple of tensors",
                     hint="save them with torch.save((x, y), path)")


def _own_example_inputs(module: torch.jit.ScriptModule, shown: str) -> tuple[Any, ...]:
    if not module._c.hasattr("example_inputs"):
        raise ModelError(f"{shown}: a TorchScript archive does not record example inputs, and "
                         "none were given", hint=_INPUTS_HINT)
    value = module.example_inputs
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise ModelError(f"{shown}: the module's `example_inputs` is {describe(value)}, expected a "
                     "tuple of tensors", hint=_INPUTS_HINT)
