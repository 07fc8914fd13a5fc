"""Capture: a method's module and example inputs -> an ATen-dialect program.

Why `strict=False`: non-strict export runs the model's Python as Python and
traces the tensor operations underneath (make_fx on fake tensors), whereas
strict export first has TorchDynamo rewrite the bytecode and fails on any
construct Dynamo does not model (many third-party libraries, unusual
Python). Non-strict captures strictly more real models, it is torch's
default, and its node stack traces point straight at the user's lines. What
strict mode would add, catching Python side effects that a trace bakes in,
exirc checks by running the compiled program against eager PyTorch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from exirc.capture.export_failures import export_error, quiet_torch
from exirc.capture.loaded_model import MethodSource
from exirc.capture.torchscript import convert
from exirc.errors import InternalError

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def capture(source: MethodSource) -> ExportedProgram:
    """The method as an ATen-dialect `ExportedProgram` (ModelError if export fails)."""
    if source.exported is not None:
        return source.exported  # a .pt2 or TorchScript archive: already a program
    if source.module is None:
        raise InternalError(f"method {source.name!r} of {source.origin} has neither a module "
                            "nor a program")
    if isinstance(source.module, torch.jit.ScriptModule):
        return convert(source.module, source.example_inputs, source.dynamic_shapes,
                       origin=source.origin)
    try:
        with quiet_torch():
            return torch.export.export(source.module, source.example_inputs,
                                       dynamic_shapes=source.dynamic_shapes, strict=False)
    except Exception as e:
        raise export_error(e, source.origin, source.name, source.path) from e
