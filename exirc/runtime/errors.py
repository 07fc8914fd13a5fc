"""Errors raised while a loaded program runs.

Load-time problems use the shared family (`FormatError`, `InputError`,
`UnsupportedOperatorError`). What is new at run time is a kernel failing on
the values it was given, or a program that does not stop; neither is exirc's
bug, and both usually mean the program (or what it was fed) is wrong, so they
share exit code 3 with invalid programs.
"""

from __future__ import annotations

from exirc.errors import ExircError


class ExecutionError(ExircError):
    """An instruction failed while a method ran; the message names it and its source."""

    exit_code = 3
    code = "E0340"
    default_hint = ("the program, or the inputs it was given, do not fit this operator; "
                    "rerun with --debug for the kernel's own traceback")


class StepLimitError(ExecutionError):
    """A run used up its budget (a loop that does not end): more steps than its
    step limit, where an instruction a loop repeats counts by its work, more
    CPU time in loops than the step limit allows, or more wall-clock time than
    the caller's limit (see `exirc.runtime.core.method` and `loop_clocks`)."""

    code = "E0341"
    default_hint = ("if the program really loops this long, raise the limit "
                    "(`exirc run --max-steps N`, or `load(..., max_steps=N)`), which also "
                    "raises the CPU time allowed for loops")
