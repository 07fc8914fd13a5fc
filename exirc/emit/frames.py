"""Source frames of an instruction, from a node's `stack_trace` meta."""

from __future__ import annotations

import re

from exirc import program as P

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')


def parse_stack_trace(stack_trace: str | None) -> list[P.Frame]:
    """Frames outermost first, each with its source line when given."""
    if not stack_trace:
        return []
    frames: list[P.Frame] = []
    lines = stack_trace.splitlines()
    for i, line in enumerate(lines):
        match = _FRAME.match(line)
        if match is None:
            continue
        context = None
        if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]):
            context = lines[i + 1].strip() or None
        frames.append(P.Frame(match["file"], int(match["line"]), match["name"], context))
    return frames
