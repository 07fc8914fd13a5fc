"""Bytes stored more than once, for the size report.

Every tensor the file stores is looked at: constant buffers (in the constant
segment or inline in the program), initial values of program state
(mutable data), named data (a delegate's weights, exirc's metadata) and
weights inside a delegate payload's own constant region. Those holding the
same bytes at different places in the file are duplicates: storing each
once would save all copies but one.

Tensors whose bytes are the same bytes of the file are not duplicates but
shared: a named-data segment inside the constant segment (a weight a kernel
reads as a constant and a delegate by key, `DataSegment.inside`). Regions
are taken in file order, and one overlapping a region already taken is
never hashed again, so the work is bounded by the file's size.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from exirc.inspector.size_delegates import DelegateSizes
from exirc.inspector.size_rows import DuplicateBytes
from exirc.inspector.size_stored_buffers import StoredBuffers
from exirc.serialize import ProgramFile
from exirc.serialize import program as P
from exirc.serialize.xnnpack.header import XnnpackHeader


@dataclass
class StoredTensor:
    """A tensor's bytes where the file stores them (`start`: the file offset,
    None for constants inline in the program, which no other region overlaps)."""

    label: str
    data: memoryview
    start: int | None
    buffer: int | None = None  # a constant's data_buffer_idx
    segment: int | None = None  # named data's segment index
    shared_with: list[str] = field(default_factory=list)


@dataclass
class Duplicates:
    """The groups of tensors holding the same bytes; for each copy after the
    first, the first, by ("buffer", data_buffer_idx) for constants and
    ("segment", index) for named data; and the constants (by buffer) whose
    bytes other tensors read in place."""

    groups: list[DuplicateBytes]
    copy_of: dict[tuple[str, int], StoredTensor]
    shared: dict[int, list[str]]


def find_duplicates(pf: ProgramFile, view: memoryview, stored: StoredBuffers,
                    delegates: DelegateSizes) -> Duplicates:
    tensors = _stored_tensors(pf, view, stored, delegates)
    placed = sorted((t for t in tensors if t.start is not None),
                    key=lambda t: (t.start, -len(t.data)))
    taken: list[StoredTensor] = [t for t in tensors if t.start is None]
    end = -1
    for tensor in placed:
        assert tensor.start is not None
        if tensor.start < end:  # the bytes of a region already taken
            last = taken[-1]
            if last.start == tensor.start and len(last.data) == len(tensor.data):
                last.shared_with.append(tensor.label)
            continue
        taken.append(tensor)
        end = tensor.start + len(tensor.data)
    groups: dict[tuple[int, bytes], list[StoredTensor]] = {}
    for tensor in taken:
        digest = hashlib.sha256(tensor.data).digest()
        groups.setdefault((len(tensor.data), digest), []).append(tensor)
    found = []
    copy_of: dict[tuple[str, int], StoredTensor] = {}
    for (size, _), copies in groups.items():
        if len(copies) > 1:
            for copy in copies[1:]:
                if copy.buffer is not None:
                    copy_of["buffer", copy.buffer] = copies[0]
                elif copy.segment is not None:
                    copy_of["segment", copy.segment] = copies[0]
            listed = copies[:DuplicateBytes.MAX_LISTED]
            found.append(DuplicateBytes([t.label for t in listed],
                                        sorted(t.buffer for t in listed if t.buffer is not None),
                                        size, len(copies)))
    shared = {t.buffer: t.shared_with for t in taken if t.shared_with and t.buffer is not None}
    return Duplicates(sorted(found, key=lambda d: (-d.saving, d.tensors)), copy_of, shared)


def _stored_tensors(pf: ProgramFile, view: memoryview, stored: StoredBuffers,
                    delegates: DelegateSizes) -> list[StoredTensor]:
    program, spans = pf.program, pf.segment_spans
    found: list[StoredTensor] = []
    for i, buffer in enumerate(program.constant_buffer):
        data = memoryview(buffer.storage)
        used = stored.tensor_bytes(None, i, len(data))
        if used:
            found.append(StoredTensor(f"constant {i}", data[:used], None, i))
    tables: list[tuple[int | None, P.SubsegmentOffsets]] = []
    if program.constant_segment is not None and program.constant_segment.offsets:
        tables.append((None, program.constant_segment))
    tables += list(enumerate(program.mutable_data_segments))
    for table, sub in tables:
        if not 0 <= sub.segment_index < len(spans):
            continue
        start, size = spans[sub.segment_index]
        for i in range(len(sub.offsets)):
            lo, hi = P.constant_span(sub.offsets, i, size)
            used = stored.tensor_bytes(table, i, hi - lo)
            if used:
                label = f"constant {i}" if table is None else f"mutable data {table}/{i}"
                found.append(StoredTensor(label, view[start + lo:start + lo + used], start + lo,
                                          i if table is None else None))
    keys: dict[int, str] = {}
    for named in program.named_data:
        keys.setdefault(named.segment_index, named.key)
    for index, key in keys.items():
        if 0 <= index < len(spans) and spans[index][1]:
            start, size = spans[index]
            shown = key if len(key) <= 16 else key[:8] + "..."
            found.append(StoredTensor(f"named data {shown!r}", view[start:start + size], start,
                                      segment=index))
    found += _payload_weights(view, spans, delegates)
    return found


def _payload_weights(view: memoryview, spans: list[tuple[int, int]],
                     delegates: DelegateSizes) -> list[StoredTensor]:
    """The weights inside XNNPACK payloads' own constant regions (each payload
    segment once, however many delegates use it)."""
    found = []
    for (location, index), payload in delegates.by_data.items():
        if payload.blob is None or location != P.DataLocation.SEGMENT or \
                not 0 <= index < len(spans):
            continue
        header = XnnpackHeader.parse(payload.data)
        if header is None:
            continue
        region = spans[index][0] + header.constant_data_offset
        for weight in payload.weights:
            if weight.named_key is None and weight.nbytes:
                start = region + weight.offset
                label = f"{payload.method} delegate[{payload.index}] weight at {weight.offset}"
                found.append(StoredTensor(label, view[start:start + weight.nbytes], start))
    return found
