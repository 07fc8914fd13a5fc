"""Source frames of an instruction, from a node's `stack_trace` meta.

The user's frames are kept, with paths relative to the working directory
when inside it: that is what a reader of an error or a listing wants, and it
keeps program files small. Torch's own frames are dropped. A model from a
library (a Hugging Face model behind a one-line wrapper) would then point
every instruction at that one line, so the innermost library frame below the
user's code is kept too, its path from the package on
(`transformers/models/gpt2/modeling_gpt2.py`), not the site-packages path.
"""

from __future__ import annotations

from exirc.ir.source import (
    SourceFrame,
    display_path,
    is_library,
    is_synthetic,
    is_torch,
    parse_stack_trace,
    short_library_path,
    user_frame,
)
from exirc.serialize import program as P


def program_frames(stack_trace: str | None) -> list[P.Frame]:
    """The user's frames of a node, outermost first, then the innermost
    library frame they called into (other than torch's), if any."""
    if not stack_trace:
        return []
    frames = [f for f in parse_stack_trace(stack_trace) if not is_synthetic(f)]
    kept = [_frame(f) for f in frames if not is_library(f)]
    library = _library_frame(frames)
    if library is not None:
        return [*kept, library]
    if not kept:
        innermost = user_frame(frames)
        kept = [_frame(innermost)] if innermost is not None else []
    return kept


def _library_frame(frames: list[SourceFrame]) -> P.Frame | None:
    """The innermost non-torch library frame below the user's innermost frame."""
    users = [i for i, f in enumerate(frames) if not is_library(f)]
    below = frames[users[-1] + 1:] if users else frames
    libraries = [f for f in below if not is_torch(f)]
    return _frame(libraries[-1]) if libraries else None


def _frame(frame: SourceFrame) -> P.Frame:
    path = short_library_path(frame.file) if is_library(frame) else display_path(frame.file)
    return P.Frame(path, frame.line, frame.function, frame.code)
