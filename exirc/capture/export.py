"""Capture: a method's module and example inputs -> an ATen-dialect program.

Why `strict=False`: non-strict export runs the model's Python as Python and
traces the tensor operations underneath (make_fx on fake tensors), whereas
strict export first has TorchDynamo rewrite the bytecode and fails on any
construct Dynamo does not model (many third-party libraries, unusual
Python). Non-strict captures strictly more real models, it is torch's
default, and its node stack traces point straight at the user's lines. What
strict mode would add, catching Python side effects that a trace bakes in,
exirc checks by running the compiled program against eager PyTorch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from exirc.capture.load import MethodSource, first_line
from exirc.errors import InternalError, ModelError
from exirc.ir.source import (
    SourceFrame,
    frame_in,
    is_library,
    parse_stack_trace,
    traceback_frames,
    user_frame,
)

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def capture(source: MethodSource) -> ExportedProgram:
    """The method as an ATen-dialect `ExportedProgram` (ModelError if export fails)."""
    if source.exported is not None:
        return source.exported  # a .pt2 or TorchScript archive: already a program
    if source.module is None:
        raise InternalError(f"method {source.name!r} of {source.origin} has neither a module "
                            "nor a program")
    if isinstance(source.module, torch.jit.ScriptModule):
        from exirc.capture.torchscript import convert

        return convert(source.module, source.example_inputs, source.dynamic_shapes,
                       origin=source.origin)
    try:
        with quiet_torch():
            return torch.export.export(source.module, source.example_inputs,
                                       dynamic_shapes=source.dynamic_shapes, strict=False)
    except Exception as e:
        raise export_error(e, source.origin, source.name, source.path) from e


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Hold back torch's own output while exporting; on failure the ModelError says it.

    A failing export logs tracebacks at ERROR level and prints its partial
    graph to stderr before raising, which would bury our one-line message.
    What reaches stderr is replayed if the export succeeds and dropped if it
    fails. TORCH_LOGS (the user asking for torch's logs) turns this off.
    """
    if os.environ.get("TORCH_LOGS"):
        yield
        return
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    held = io.StringIO()
    failed = False
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException:
        failed = True
        raise
    finally:
        logger.setLevel(level)
        if not failed:
            sys.stderr.write(held.getvalue())


def export_error(error: Exception, origin: str, method: str,
                 model_path: str | None) -> ModelError:
    """A torch.export failure as a ModelError: torch's first line, the user's line, a hint."""
    text = str(error)
    lines = [f"{origin}: cannot export method '{method}': {type(error).__name__}: "
             f"{first_line(error)}"]
    frame = _user_line(error, text, model_path)
    if frame is not None:
        lines.append(f"  at {frame}")
    return ModelError("\n".join(lines), hint=_hint(error, text))


def _user_line(error: Exception, text: str, model_path: str | None) -> SourceFrame | None:
    """The user's line: where torch's message says, else the innermost user frame raised in."""
    mentioned = parse_stack_trace(text)
    raised = traceback_frames(error.__traceback__)
    if model_path is not None:
        directory = os.path.dirname(os.path.abspath(model_path))
        return frame_in(mentioned, directory) or frame_in(raised, directory)
    in_user_code = [f for f in mentioned + raised if not is_library(f) and not _is_ours(f)]
    return user_frame(in_user_code)


def _is_ours(frame: SourceFrame) -> bool:
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.abspath(frame.file).startswith(package + os.sep)


def _hint(error: Exception, text: str) -> str:
    from torch._dynamo.exc import Unsupported
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    if isinstance(error, GuardOnDataDependentSymNode) or "data-dependent" in text:
        return ("the model's control flow or a shape depends on a tensor's value; use "
                "torch.cond(pred, true_fn, false_fn, operands) for a branch, or "
                "torch._check(...) to tell export what holds")
    if "Constraints violated" in text or "dynamic_shapes" in text:
        fixes = _suggested_fixes(text)
        advice = f" torch suggests: {fixes}" if fixes else ""
        return "the dynamic_shapes conflict with what the model does with those sizes." + advice
    if isinstance(error, Unsupported):
        return ("torch.export cannot trace this construct; rewrite it with tensor operations "
                "(torch.cond for branches on tensors)")
    return ("export runs forward on the example inputs: check that the model runs on them "
            "in eager PyTorch; --debug shows torch's full message")


def _suggested_fixes(text: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("Suggested fixes"):
            fixes = []
            for fix in lines[i + 1:]:
                if not fix.startswith((" ", "\t")) or not fix.strip():
                    break
                fixes.append(fix.strip())
            return "; ".join(fixes)
    return ""
