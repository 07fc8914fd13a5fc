"""The exirc error family.

Every error a user can fix is an `ExircError` subclass that says what was
wrong, where, and what to do. `InternalError` is for our own bugs. The CLI
maps each class to a documented exit code and prints one line plus the hint;
the traceback only with `--debug`.

Exit codes (also in docs/cli.md):

    0  success
    1  internal error (a bug in exirc: please report it)
    2  usage error (bad command line, missing or unreadable input file)
    3  invalid model or program file
    4  unsupported operator
    5  verification mismatch
"""

from __future__ import annotations


class ExircError(Exception):
    """Base of every error exirc raises on purpose."""

    exit_code = 1
    code = "E0000"
    default_hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint is not None else self.default_hint

    def __str__(self) -> str:
        return self.message


class UsageError(ExircError):
    """The command line or an argument is wrong, or an input file is missing."""

    exit_code = 2
    code = "E0200"
    default_hint = "`exirc COMMAND --help` shows the arguments, with examples"


class InputError(UsageError):
    """Inputs given to a program do not match its signature or are unreadable."""

    code = "E0201"
    default_hint = ("`exirc inspect PROGRAM` lists each method's inputs: their names, dtypes "
                    "and shapes")


class PluginError(UsageError):
    """A user's plugin (a pass named `module:attr`, a kernel) raised."""

    code = "E0202"
    default_hint = "the error is in your plugin; rerun with --debug for its traceback"


class TargetQuantizationError(UsageError):
    """The target cannot run a layer of the chosen quantization mode as it is stored."""

    code = "E0204"
    default_hint = ("use --quantize 8da4w or 8da8w (activations quantized inside XNNPACK), "
                    "or --target portable")


class ExternalDataError(UsageError):
    """A program keeps weights in an external data file (`.ptd`) that was not
    given, or the one given does not hold what the program reads."""

    code = "E0205"
    default_hint = ("pass the data file the program was compiled with: `exirc run PROGRAM "
                    "--data FILE.ptd` (exirc.load(program, data=FILE))")


class FormatError(ExircError):
    """A program file is malformed: `field` is the path of the bad field."""

    exit_code = 3
    code = "E0300"
    default_hint = "the file is not a valid .pte program; re-create it with `exirc compile`"

    def __init__(self, message: str, *, field: str = "", hint: str | None = None) -> None:
        self.field = field
        full = f"{field}: {message}" if field else message
        super().__init__(full, hint=hint)


class ResourceError(ExircError):
    """A program, or what it was given, needs more memory or work than allowed or
    available (an arena beyond --max-memory, an input that inflates too far)."""

    exit_code = 3
    code = "E0350"
    default_hint = ("if the file is trusted and the machine has the resources, raise the "
                    "limit (`exirc run --max-memory SIZE`, or `load(..., max_memory=...)`)")


class ModelError(ExircError):
    """A model file or model definition cannot be loaded or exported."""

    exit_code = 3
    code = "E0310"
    default_hint = "fix the model file; --debug shows the whole traceback"


class DialectError(ExircError):
    """A graph breaks its dialect's contract (found by a verifier between stages)."""

    exit_code = 3
    code = "E0330"
    default_hint = "`exirc compile --print-ir-after-all` shows the graph after every pass"


class UnsupportedOperatorError(ExircError):
    """An operator has no kernel or no out-variant on the chosen target."""

    exit_code = 4
    code = "E0400"
    default_hint = ("rewrite the model with supported operators, or register a kernel for it "
                    "(exirc.runtime.register_kernel)")


class OperatorNotSupportedError(UnsupportedOperatorError):
    """The model uses an operator outside the Edge op set (a custom op, or an
    ATen op with no decomposition into core ATen) and no kernel provides it."""

    code = "E0401"
    default_hint = ("register a kernel for it in a module you pass with --plugin (to `exirc "
                    "compile` and `exirc run`), or change the model to avoid the operator")


class VerificationError(ExircError):
    """Outputs differ from the reference beyond tolerance."""

    exit_code = 5
    code = "E0500"
    default_hint = ("`exirc compile --print-ir-after-all` shows the graph after each pass, "
                    "to find the one that changed the result")


class InternalError(ExircError):
    """A bug in exirc, not in the user's model or file."""

    exit_code = 1
    code = "E0100"
    default_hint = (
        "this is a bug in exirc; please report it with the command you ran and --debug output"
    )
