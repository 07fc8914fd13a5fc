"""What loading a model file gives: its methods, each ready to capture.

The shared vocabulary of the capture stage: every loader (model.py, .pt2,
TorchScript) returns a `LoadedModel`, and `capture` takes its
`MethodSource`s. Kept apart from the loaders so that they and capture can
all import it without importing one another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.export import ExportedProgram

Warn = Callable[[str], None]  # where a loader reports what it fixed up (training mode, say)

MAIN_METHOD = "forward"


@dataclass(frozen=True)
class MethodSource:
    """One entry point to capture: a module and its example inputs, or a program.

    `exported` is set when the file already holds a program (.pt2,
    TorchScript); `module` is then the reference to compare against, if any.
    `path` is the model file, whose frames locate errors found later.
    """

    name: str
    module: torch.nn.Module | None
    example_inputs: tuple[Any, ...]
    dynamic_shapes: Any
    exported: ExportedProgram | None
    origin: str
    path: str | None = None


@dataclass(frozen=True)
class LoadedModel:
    methods: dict[str, MethodSource]  # "forward" first
    origin: str
    # name -> value: methods that return a value and do no work (`constant_methods`)
    constant_methods: dict[str, Any] = field(default_factory=dict)
