"""When torch.export fails: its noise held back, its exception a ModelError.

Shared by `capture` (an nn.Module) and `torchscript` (a converted or
interpreted TorchScript module), which both run torch.export on the user's
model and word its failures alike: torch's first line, the user's line, a
hint at the usual fix.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from collections.abc import Iterator

from exirc.capture.messages import first_line
from exirc.errors import ModelError
from exirc.ir.source import (
    SourceFrame,
    frame_in,
    is_library,
    is_synthetic,
    parse_stack_trace,
    traceback_frames,
    user_frame,
)


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
    # `<string>`, `<eval_with_key>`: code torch or a library generated, not the user's
    mentioned = [f for f in parse_stack_trace(text) if not is_synthetic(f)]
    raised = [f for f in traceback_frames(error.__traceback__) if not is_synthetic(f)]
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
    given = _unsupported_input(text)
    if given is not None and given.endswith("Cache"):
        return (f"a transformers cache object ({given}) is passed as an input, and a "
                "program's inputs are tensors: keep the cache inside the model as buffers it "
                "updates (transformers' TorchExportableModuleWithStaticCache does; docs/llm.md "
                "shows the whole path)")
    if given is not None:
        return (f"an input is a {given}, which torch.export cannot take: pass tensors "
                "(or tuples, lists and dicts of them), or register the type with "
                "torch.export.register_dataclass")
    if "DynamicCache" in text or "cache_utils" in text:
        return ("the model returns a transformers cache object (DynamicCache): pass "
                "use_cache=False in example_inputs (or set model.config.use_cache = False), "
                "or give the model a static cache")
    if isinstance(error, Unsupported):
        return ("torch.export cannot trace this construct; rewrite it with tensor operations "
                "(torch.cond for branches on tensors)")
    return ("export runs forward on the example inputs: check that the model runs on them "
            "in eager PyTorch; --debug shows torch's full message")


def _unsupported_input(text: str) -> str | None:
    """The class name in torch.export's "Unsupported input type <class 'a.b.C'>"."""
    found = re.search(r"Unsupported input type <class '([\w.]+)'>", text)
    return found.group(1).rsplit(".", 1)[-1] if found else None


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
