"""Loading a .pt2 archive, saved by torch.export.save: a program already captured.

Its example inputs are the ones the archive recorded; there is no module to
compare against.
"""

from __future__ import annotations

from typing import Any

import torch

from exirc.capture.loaded_model import MAIN_METHOD, LoadedModel, MethodSource
from exirc.capture.messages import first_line
from exirc.errors import ModelError
from exirc.ir.quantize_ops import define_quantize_ops
from exirc.ir.source import display_path


def load_pt2(path: str) -> LoadedModel:
    """The archive's program as the main method."""
    shown = display_path(path)
    define_quantize_ops()  # a quantized program calls them; loading resolves them by name
    try:
        exported = torch.export.load(path)
    except Exception as e:
        raise ModelError(f"{shown}: cannot load the .pt2 archive: {first_line(e)}",
                         hint="save it again with torch.export.save, with torch "
                              f"{torch.__version__.split('+')[0]} (the one exirc uses)") from e
    inputs = exported.example_inputs
    args: tuple[Any, ...] = tuple(inputs[0]) if inputs is not None else ()
    source = MethodSource(MAIN_METHOD, None, args, None, exported, shown)
    return LoadedModel({MAIN_METHOD: source}, shown)
