"""The size report's data: rows of bytes that sum to the file, and bytes stored twice."""

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
class DuplicateBytes:
    """Tensors the file stores at different places, holding identical bytes."""

    # The copies, e.g. "constant 3", "named data 'a1b2c3d4...'" (the first
    # `MAX_LISTED` in file order), and how many there are.
    tensors: list[str]
    buffers: list[int]  # the data_buffer_idx of the listed copies that are constants
    nbytes: int  # bytes of one copy
    count: int = 0  # 0: as many as listed

    MAX_LISTED = 64

    @property
    def copies(self) -> int:
        return self.count or len(self.tensors)

    @property
    def saving(self) -> int:
        return self.nbytes * (self.copies - 1)

    def to_json(self) -> dict[str, Any]:
        return {"buffers": self.buffers, "tensors": self.tensors, "count": self.copies,
                "bytes": self.nbytes, "saving": self.saving}


@dataclass
class SizeReport:
    file_size: int
    rows: list[SizeRow]
    duplicates: list[DuplicateBytes]

    @property
    def duplicate_bytes(self) -> int:
        """Bytes that storing each distinct tensor once would save."""
        return sum(d.saving for d in self.duplicates)

    @property
    def duplicate_tensors(self) -> int:
        """How many tensors are copies of another's bytes (all but one of each group)."""
        return sum(d.copies - 1 for d in self.duplicates)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [row.to_json() for row in self.rows],
                "duplicates": [d.to_json() for d in self.duplicates],
                "duplicate_bytes": self.duplicate_bytes,
                "duplicate_tensors": self.duplicate_tensors}
