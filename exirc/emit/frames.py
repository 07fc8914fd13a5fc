"""Source frames of an instruction, from a node's `stack_trace` meta.

Only the user's frames are kept (not torch's or other libraries' internals),
with paths relative to the working directory when inside it: that is what a
reader of an error or a listing wants, and it keeps program files small.
"""

from __future__ import annotations

from exirc.ir.source import display_path, is_library, is_synthetic, parse_stack_trace, user_frame
from exirc.serialize import program as P


def program_frames(stack_trace: str | None) -> list[P.Frame]:
    """The user's frames of a node, outermost first."""
    if not stack_trace:
        return []
    frames = parse_stack_trace(stack_trace)
    kept = [f for f in frames if not is_synthetic(f) and not is_library(f)]
    if not kept:
        innermost = user_frame(frames)
        kept = [innermost] if innermost is not None else []
    return [P.Frame(display_path(f.file), f.line, f.function, f.code) for f in kept]
