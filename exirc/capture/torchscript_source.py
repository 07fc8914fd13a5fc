"""Where a TorchScript node is in the scripted source.

Both error messages (`at_line`) and the FX nodes torch.export makes
(`stack_trace`) point at that line, so a problem found later in the
compiler still names the user's TorchScript code.
"""

from __future__ import annotations

import re

import torch

from exirc.ir.source import SourceFrame

_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def at_line(node: torch._C.Node) -> str:
    """`\n  at model.py:12: code`, the line ending a message, if the source is known."""
    frame = _source(node)
    return f"\n  at {frame}" if frame is not None else ""


def stack_trace(node: torch._C.Node) -> list[str]:
    """The node's source line as a Python stack trace, which export puts on its FX nodes."""
    frame = _source(node)
    if frame is None:
        return []
    return [f'  File "{frame.file}", line {frame.line}, in forward\n    {frame.code or ""}\n']


def _source(node: torch._C.Node) -> SourceFrame | None:
    """Where the node is in the scripted source.

    Some nodes have no source range (constants, prim::tolist): then the
    line of the first node using its result, else of its enclosing node.
    """
    users = [use.user for value in node.outputs() for use in value.uses()]
    for candidate in [node, *users[:1]]:
        frame = _frame(str(candidate.sourceRange()))
        if frame is not None:
            return frame
    current: torch._C.Node | None = node
    while current is not None:
        frame = _frame(str(current.sourceRange()))
        if frame is not None:
            return frame
        block = current.owningBlock()
        current = block.owningNode() if block is not None else None
    return None


def _frame(source_range: str) -> SourceFrame | None:
    """The first `File "...", line N` of a source range, with its highlighted code line."""
    match = _FILE_LINE.search(source_range)
    if match is None:
        return None
    lines = source_range[match.end():].splitlines()[1:]
    code = None
    for previous, line in zip(lines, lines[1:]):
        if line.strip() and set(line.strip().split(" <---")[0]) <= {"~"}:
            code = previous.strip()
            break
    return SourceFrame(match["file"], int(match["line"]), code)
