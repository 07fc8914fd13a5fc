"""Where in the user's code something came from, for error messages.

Two sources of Python frames, both outermost first:

  * a graph node's `meta["stack_trace"]`, which torch.export records as text
    (`File "model.py", line 12, in forward` then the code line);
  * the traceback of an exception raised while loading or tracing a model.

The user's line is the innermost frame that is neither inside torch nor
synthetic (`<eval_with_key>.3`, code torch generated). Every stage reports
locations through this module, so they all look alike: `model.py:12: code`.
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<name>.+))?')
_LIBRARY = ("/torch/", "/transformers/", "/site-packages/", "/dist-packages/")


@dataclass(frozen=True)
class SourceFrame:
    file: str
    line: int
    code: str | None = None
    function: str | None = None

    @property
    def location(self) -> str:
        """`model.py:12`, the path relative to the working directory when inside it."""
        return f"{display_path(self.file)}:{self.line}"

    def __str__(self) -> str:
        return f"{self.location}: {self.code}" if self.code else self.location


def display_path(path: str) -> str:
    """`path` relative to the working directory if it lies inside it, else as given."""
    if path.startswith("<"):
        return path
    absolute = os.path.abspath(path)
    try:
        relative = os.path.relpath(absolute)
    except ValueError:  # another drive on Windows
        return path
    return absolute if relative.startswith("..") else relative


def parse_stack_trace(stack_trace: str) -> list[SourceFrame]:
    """The frames of a `stack_trace` text, outermost first."""
    lines = stack_trace.splitlines()
    frames = []
    for i, line in enumerate(lines):
        match = _FRAME.search(line)
        if match is None:
            continue
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        code = None if not following or _FRAME.search(following) else following
        function = match["name"].strip() if match["name"] else None
        frames.append(SourceFrame(match["file"], int(match["line"]), code, function))
    return frames


def traceback_frames(tb: TracebackType | None) -> list[SourceFrame]:
    """The frames of an exception's traceback, outermost first."""
    return [
        SourceFrame(f.filename, f.lineno or 0, (f.line or "").strip() or None)
        for f in traceback.extract_tb(tb)
    ]


def is_synthetic(frame: SourceFrame) -> bool:
    return frame.file.startswith("<")


def is_library(frame: SourceFrame) -> bool:
    return any(library in frame.file.replace(os.sep, "/") for library in _LIBRARY)


def user_frame(frames: Sequence[SourceFrame]) -> SourceFrame | None:
    """The innermost frame of user code; a library frame if there is no other."""
    real = [f for f in frames if not is_synthetic(f)]
    user = [f for f in real if not is_library(f)]
    return (user or real)[-1] if real else None


def frame_in(frames: Sequence[SourceFrame], directory: str) -> SourceFrame | None:
    """The innermost frame of user code under `directory` (a model file and its siblings)."""
    root = os.path.realpath(directory) + os.sep
    inside = [f for f in frames
              if not is_library(f) and os.path.realpath(f.file).startswith(root)]
    return inside[-1] if inside else None


def source_location(node: Any) -> str | None:
    """`file.py:12: code` of the innermost user frame of a node, or None if unknown."""
    stack_trace = getattr(node, "meta", {}).get("stack_trace")
    if not stack_trace:
        return None
    frame = user_frame(parse_stack_trace(stack_trace))
    return str(frame) if frame is not None else None


def describe_node(node: Any) -> str:
    """`node %addmm (aten.addmm.default) at model.py:12: ...` for messages."""
    where = source_location(node)
    text = f"node %{node.name} ({node.target})"
    return f"{text} at {where}" if where else text
