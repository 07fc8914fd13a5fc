"""All methods -> one `Program`, sharing deduplicated constant data."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exirc import program as P
from exirc.emit.constants import ConstantTable
from exirc.emit.method import MethodEmitter

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def emit_program(methods: dict[str, ExportedProgram]) -> P.Program:
    """Out-variant, memory-planned methods -> the program model."""
    constants = ConstantTable()
    program = P.Program()
    for name, exported in methods.items():
        program.execution_plan.append(MethodEmitter(name, exported, constants).emit())
    constants.attach(program)
    return program
