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
_SELF = re.compile(r"^(?:L\['self'\]|L__self__|self)(?:\.|$)")
_INDEX = re.compile(r"\[(?:'([^']*)'|(\d+))\]")
_INSTALLED = ("/site-packages/", "/dist-packages/")
_TORCH = ("/torch/", "/functorch/")


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


def short_library_path(path: str) -> str:
    """An installed package's file from its package on
    (`transformers/models/gpt2/modeling_gpt2.py`, not `/home/.../site-packages/...`);
    any other path as `display_path` shows it."""
    unix = path.replace(os.sep, "/")
    for installed in _INSTALLED:
        at = unix.rfind(installed)
        if at >= 0 and at + len(installed) < len(unix):
            return unix[at + len(installed):]
    return display_path(path)


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


def is_torch(frame: SourceFrame) -> bool:
    """Whether a frame is inside torch itself (its modules' `forward`s, tracing
    machinery): lines that say nothing about which model computed what."""
    return any(part in frame.file.replace(os.sep, "/") for part in _TORCH)


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


def module_path(node: Any) -> str:
    """The submodule a node was traced in, as `model.get_submodule` names it
    (`encoder.layers.1.linear`); "" for the model itself or when unknown.

    torch.export records the enclosing modules in `meta["nn_module_stack"]`,
    outermost first; the innermost is the one. Older tracers spelled the
    path as code (`L['self'].layers[1].linear`): that is rewritten the same way.
    """
    stack = getattr(node, "meta", {}).get("nn_module_stack")
    if not stack:
        return ""
    entry = list(stack.values())[-1]
    path = entry[0] if isinstance(entry, tuple) and entry else ""
    return normal_module_path(path) if isinstance(path, str) else ""


def normal_module_path(path: str) -> str:
    """`L['self'].layers[1]['q']` -> `layers.1.q`: dotted, relative to the model."""
    path = _SELF.sub("", path.strip())
    return _INDEX.sub(lambda m: "." + (m[1] if m[1] is not None else m[2]), path).strip(".")


def describe_node(node: Any) -> str:
    """`node %addmm (aten.addmm.default) at model.py:12: ... [module encoder.fc]` for messages."""
    where = source_location(node)
    text = f"node %{node.name} ({node.target})"
    text = f"{text} at {where}" if where else text
    module = module_path(node)
    return f"{text} [module {module}]" if module else text
