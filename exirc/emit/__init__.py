"""Stage: emit. Out-variant graphs -> the program model (`exirc.program`)."""

from exirc.emit.program import emit_program

__all__ = ["emit_program"]
