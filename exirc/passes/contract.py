"""The one pass contract every stage uses.

A pass takes an `ExportedProgram` in one dialect and returns a
`PassResult`: the program (the same object mutated in place, or a new one)
and whether anything changed. A pass is a frozen dataclass whose fields are
its options, so a pipeline YAML entry `{name: options}` constructs it, and
its docstring states the dialect it takes and returns. A plain function
`fn(program, **options) -> PassResult` is a pass too (user plugins named
`module:attr` may be either).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclass
class PassResult:
    program: ExportedProgram
    changed: bool


@dataclass(frozen=True)
class Pass:
    """Base of class-style passes; subclasses set `name` and implement `run`."""

    name: ClassVar[str] = "pass"

    def run(self, program: ExportedProgram) -> PassResult:
        raise NotImplementedError(f"{type(self).__name__}.run")


PassFunction = Callable[..., PassResult]


@dataclass(frozen=True)
class FunctionPass(Pass):
    """Adapts a plain function (and its options) to the contract."""

    function: PassFunction
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        return getattr(self.function, "__name__", repr(self.function))

    def run(self, program: ExportedProgram) -> PassResult:
        return self.function(program, **dict(self.options))


def pass_label(p: Pass) -> str:
    return p.label if isinstance(p, FunctionPass) else p.name
