"""All methods -> one `Program`, sharing deduplicated constant data."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exirc import program as P
from exirc import symbolic_shapes
from exirc.emit.constants import ConstantTable
from exirc.emit.method import MethodEmitter
from exirc.emit.shapes import method_shapes

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def emit_program(methods: dict[str, ExportedProgram]) -> P.Program:
    """Out-variant, memory-planned methods -> the program model."""
    constants = ConstantTable()
    program = P.Program()
    shapes = {}
    for name, exported in methods.items():
        emitter = MethodEmitter(name, exported, constants)
        program.execution_plan.append(emitter.emit())
        method = method_shapes(emitter.table.symbolic_dims, exported)
        if method is not None:
            shapes[name] = method
    constants.attach(program)
    if shapes:
        program.add_named_segment(symbolic_shapes.NAMED_DATA_KEY, symbolic_shapes.encode(shapes))
    return program
