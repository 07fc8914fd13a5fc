"""Where a field of a checked FlatBuffer is, spelled out only when needed."""

from __future__ import annotations

from typing import Any


class Path:
    """A field path, spelled out only when an error (or a report) names it.

    Decoding visits millions of tables in a big program; building the text
    `root.execution_plan[0].chains[0].instructions[123]` for each would cost
    more than the tables themselves. A Path keeps its parent and its own
    part instead: `Path(parent, ".name")`, `Path(parent, "[3]")`.
    """

    __slots__ = ("parent", "part", "index", "note")

    def __init__(self, parent: str | Path, part: str, index: int | None = None) -> None:
        self.parent = parent
        self.part = part
        self.index = index
        # What a reader that records attaches to the table here (the size
        # report: which row its bytes go to), for its children to start from.
        self.note: Any = None

    def __str__(self) -> str:
        parts = []
        node: str | Path = self
        while isinstance(node, Path):
            parts.append(node.part if node.index is None else f"{node.part}[{node.index}]")
            node = node.parent
        parts.append(node)
        return "".join(reversed(parts))
