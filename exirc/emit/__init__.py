"""Stage: emit. Out-variant graphs -> the program model (`exirc.program`)."""

from exirc.emit.program import EmittedProgram, emit_methods, emit_program

__all__ = ["EmittedProgram", "emit_methods", "emit_program"]
