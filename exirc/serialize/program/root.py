"""Schema: table Program, the root of a `.pte` file, and where its data lives:
buffers inside the FlatBuffer, data segments after it, and named data."""

from __future__ import annotations

from dataclasses import dataclass, field

from exirc.errors import UsageError
from exirc.serialize.program.plans import ExecutionPlan

# Version of the program schema we write (Program.version).
SCHEMA_VERSION = 0

# Each constant tensor starts at a multiple of this inside its segment.
CONSTANT_ALIGNMENT = 16


@dataclass(slots=True)
class Buffer:
    """Schema: table Buffer (constant data inside the FlatBuffer)."""

    storage: bytes


@dataclass(slots=True)
class BackendDelegateInlineData:
    """Schema: table BackendDelegateInlineData."""

    data: bytes


@dataclass(slots=True)
class DataSegment:
    """Schema: table DataSegment, carrying its bytes (offset/size are layout).

    `data` is `bytes`, or a `memoryview` into the mapped file when read from
    a path, so weights are not copied.

    `inside` is (index, offset) when these bytes are also part of another
    segment's, at that offset (a weight a kernel reads as a constant and a
    delegate reads by key): the file stores them once, there, and this
    segment's offset and size point into it. ExecuTorch's runtime loads each
    segment by its offset and size, so segments may share bytes.

    `packed` segments need no alignment (exirc's own metadata, parsed as
    bytes, never mapped as tensors): the writer stores them after the
    aligned ones, back to back, so they cost no padding.
    """

    data: bytes | memoryview
    inside: tuple[int, int] | None = None
    packed: bool = False


@dataclass(slots=True)
class SubsegmentOffsets:
    """Schema: table SubsegmentOffsets. Sub-buffer starts inside a segment."""

    segment_index: int
    offsets: list[int] = field(default_factory=list)


@dataclass(slots=True)
class NamedData:
    """Schema: table NamedData."""

    key: str
    segment_index: int


@dataclass(slots=True)
class Program:
    """Schema: table Program, the root of a `.pte` file."""

    execution_plan: list[ExecutionPlan] = field(default_factory=list)
    version: int = SCHEMA_VERSION
    constant_buffer: list[Buffer] = field(default_factory=list)
    backend_delegate_data: list[BackendDelegateInlineData] = field(default_factory=list)
    segments: list[DataSegment] = field(default_factory=list)
    constant_segment: SubsegmentOffsets | None = None
    mutable_data_segments: list[SubsegmentOffsets] = field(default_factory=list)
    named_data: list[NamedData] = field(default_factory=list)

    def method(self, name: str) -> ExecutionPlan:
        for plan in self.execution_plan:
            if plan.name == name:
                return plan
        known = ", ".join(plan.name for plan in self.execution_plan) or "none"
        raise UsageError(f"no method named {name!r} in the program (methods: {known})")

    def named_segment(self, key: str) -> bytes | memoryview | None:
        """The data of the segment `named_data` names `key`, or None."""
        for named in self.named_data:
            if named.key == key and 0 <= named.segment_index < len(self.segments):
                return self.segments[named.segment_index].data
        return None

    def add_named_segment(self, key: str, data: bytes,
                          inside: tuple[int, int] | None = None, *,
                          packed: bool = False) -> None:
        """Store `data` in a new segment that `named_data` names `key` (or
        point it `inside` another segment that holds the same bytes).

        Runtimes look named data up by key, so one that does not know the
        key ignores it (exirc keeps its own metadata there). `packed`: the
        bytes need no alignment (see DataSegment).
        """
        self.segments.append(DataSegment(data, inside, packed))
        self.named_data.append(NamedData(key, len(self.segments) - 1))

    def constant_count(self) -> int:
        """Number of constant buffers, counting the reserved entry 0."""
        if self.constant_segment is not None and self.constant_segment.offsets:
            return len(self.constant_segment.offsets)
        return len(self.constant_buffer)

    def constant_data(self, data_buffer_idx: int) -> bytes | memoryview:
        """The bytes of constant buffer `data_buffer_idx`, up to the next one.

        The tensor using it may use fewer bytes (trailing alignment padding).
        """
        segment = self.constant_segment
        if segment is not None and segment.offsets:
            data = self.segments[segment.segment_index].data
            start, end = constant_span(segment.offsets, data_buffer_idx, len(data))
            return data[start:end]
        return self.constant_buffer[data_buffer_idx].storage


def constant_span(offsets: list[int], index: int, segment_size: int) -> tuple[int, int]:
    """(start, end) of constant buffer `index` inside its segment.

    A buffer ends where the next one starts, or at the segment's end for the
    last; a next offset below this one (a malformed file) leaves it empty.
    """
    start = offsets[index]
    end = offsets[index + 1] if index + 1 < len(offsets) else segment_size
    return start, max(start, min(end, segment_size))


def pack_subsegments(buffers: list[bytes], alignment: int) -> tuple[bytes, list[int]]:
    """Concatenate `buffers`, each starting at a multiple of `alignment`
    (`CONSTANT_ALIGNMENT` for constants).

    Returns the segment bytes and each buffer's offset, the form that
    `SubsegmentOffsets` stores.
    """
    out = bytearray()
    offsets = []
    for buf in buffers:
        out.extend(b"\0" * (-len(out) % alignment))
        offsets.append(len(out))
        out.extend(buf)
    return bytes(out), offsets
