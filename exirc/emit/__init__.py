"""Stage: emit. Out-variant graphs -> the program model (`exirc.serialize.program`)."""

from exirc.emit.program import EmittedProgram, emit_methods, emit_program

__all__ = ["EmittedProgram", "emit_methods", "emit_program"]
