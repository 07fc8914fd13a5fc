"""The size report's data: rows of bytes that sum to the file, and duplicated constants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SizeRow:
    group: str  # the region of the file, e.g. "program (FlatBuffer)"
    item: str  # what the bytes are, e.g. "forward: instructions (3)"
    kind: str  # a category for programs, e.g. "instructions", "constant", "padding"
    nbytes: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "item": self.item, "kind": self.kind,
                "bytes": self.nbytes, **self.detail}


@dataclass(frozen=True)
class DuplicateConstants:
    """Constant buffers holding identical bytes."""

    buffers: list[int]  # data_buffer_idx values, ascending
    nbytes: int  # bytes of one copy

    @property
    def saving(self) -> int:
        return self.nbytes * (len(self.buffers) - 1)

    def to_json(self) -> dict[str, Any]:
        return {"buffers": self.buffers, "bytes": self.nbytes, "saving": self.saving}


@dataclass
class SizeReport:
    file_size: int
    rows: list[SizeRow]
    duplicates: list[DuplicateConstants]

    @property
    def duplicate_bytes(self) -> int:
        """Bytes that storing each distinct constant once would save."""
        return sum(d.saving for d in self.duplicates)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [row.to_json() for row in self.rows],
                "duplicates": [d.to_json() for d in self.duplicates],
                "duplicate_bytes": self.duplicate_bytes}
