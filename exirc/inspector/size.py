"""Size report: every byte of a `.pte` file, attributed.

The file is cut into regions: the 8-byte FlatBuffer prefix (root offset and
file identifier), the extended header, the FlatBuffer of program tables and
the data segments; bytes between regions are padding. Inside the
FlatBuffer, the report decodes the tables again with a reader that records
the byte span of every table, vtable, vector and string it visits, and
charges each span to the part of the program its field path names (a
method's values, instructions, stack traces, operators, ...). Bytes no span
covers are the FlatBuffer's alignment padding (or fields this reader does
not know). A vtable shared by several tables counts once, toward the first.

Inside segments, each constant buffer is charged to the constant tensor
that uses it; the slack between tensors is alignment padding. Regions and
spans are swept in file order and every byte goes to exactly one row, so
the rows sum to the file size by construction, even in a malformed file
whose spans overlap.

Constants are named by pluggable `NameSource`s, tried in order. First come
the names exirc's compiler stores beside the program (`exirc.serialize.constant_names`:
parameter names, and what folded constants were computed from), then
`extra_tensor_info.fully_qualified_name`, which ExecuTorch writes for some
tensors; without a name a constant is shown by its value index and the
first operator using it. Identical bytes stored at more than one place
(constants, mutable data, named data, delegate weights) are reported as
duplicates, with the bytes storing each once would save; a constant whose
bytes named data reads in place (a tied weight a delegate reads too) says
who shares it.

This module sweeps the file; the pieces it uses are `size_rows` (the report),
`size_ledger` (charging bytes to rows), `size_flatbuffer` (the FlatBuffer's
spans), `size_stored_buffers` and `size_constant_names` (constants and their
names), `size_duplicates` (bytes stored twice); `size_text` renders the report.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy

from exirc.inspector.describe import segment_roles
from exirc.inspector.size_constant_names import DEFAULT_NAME_SOURCES, NameSource, stored_names
from exirc.inspector.size_delegates import DelegateSizes
from exirc.inspector.size_duplicates import Duplicates, find_duplicates
from exirc.inspector.size_flatbuffer import flatbuffer_fill
from exirc.inspector.size_ledger import Claim, Fill, Ledger
from exirc.inspector.size_rows import SizeReport
from exirc.inspector.size_stored_buffers import StoredBuffers
from exirc.serialize import ProgramFile, read_program_file
from exirc.serialize import program as P
from exirc.serialize.header import HEADER_OFFSET


def size_report(data: bytes | memoryview, program_file: ProgramFile | None = None, *,
                name_sources: Sequence[NameSource] = DEFAULT_NAME_SOURCES) -> SizeReport:
    """Attribute every byte of the file `data`; `program_file` is its parse,
    if already read."""
    view = memoryview(data)
    pf = program_file if program_file is not None else read_program_file(view)
    ledger = Ledger()
    stored = StoredBuffers(pf.program, (stored_names(pf.program), *name_sources))
    delegates = DelegateSizes(pf.program)
    # Regions: fixed ones (`fills`, in order), then the segments; all are
    # declared now (rows list in declaration order) and filled in file order.
    starts: list[int] = []
    ends: list[int] = []
    fills: list[Fill] = []

    def region(start: int, end: int, fill: Fill) -> None:
        starts.append(start)
        ends.append(end)
        fills.append(fill)

    prefix = ledger.declare(("prefix",), "header", "root offset and file identifier",
                            "identifier")
    region(0, HEADER_OFFSET, ledger.fill(prefix))
    flatbuffer_start = HEADER_OFFSET
    if pf.header is not None:
        header = ledger.declare(("header",), "header", "extended header", "header")
        flatbuffer_start += pf.header.length
        region(HEADER_OFFSET, flatbuffer_start, ledger.fill(header))
    region(flatbuffer_start, pf.program_size,
           flatbuffer_fill(ledger, view[:pf.program_size], pf.program, stored, delegates))
    segments = _Segments(ledger, view, pf.program, stored, delegates)
    fixed = len(fills)
    for index, (start, size) in enumerate(pf.segment_spans):
        starts.append(start)
        ends.append(start + size)
        if size:
            segments.declare(index, start, size)

    # Regions in file order; a byte already charged by an earlier region
    # (overlapping segments in a malformed file) is not charged again.
    gaps = _Gaps(ledger, pf)
    order = numpy.lexsort((numpy.array(ends, dtype=numpy.int64),
                           numpy.array(starts, dtype=numpy.int64)))
    cursor = 0
    for k in order.tolist():
        start, end = starts[k], ends[k]
        if start == end and k >= fixed:
            continue  # an empty segment
        if start > cursor:
            gaps.charge(cursor, min(start, pf.file_size))
        if end > cursor:
            fill = fills[k] if k < fixed else segments.fill(k - fixed, start, end - start)
            fill(max(start, cursor), end)
            cursor = end
    if cursor < pf.file_size:
        gaps.charge(cursor, pf.file_size)

    duplicates = find_duplicates(pf, view, stored, delegates)
    _note_duplicates(ledger, duplicates)
    rows = [row for row in ledger.rows.values() if row.nbytes]
    return SizeReport(pf.file_size, rows, duplicates.groups)


def _note_duplicates(ledger: Ledger, duplicates: Duplicates) -> None:
    """Mark the rows of copies: `duplicate_of` (the first constant with the same
    bytes, for a constant) or `same_bytes_as` (the first copy's label); and
    the constants other tensors read in place, `shared_with`."""
    for row in ledger.rows.values():
        if row.kind == "constant" and "buffer" in row.detail:
            buffer = row.detail["buffer"]
            first = duplicates.copy_of.get(("buffer", buffer))
            if first is not None and first.buffer is not None:
                row.detail["duplicate_of"] = first.buffer
            elif first is not None:
                row.detail["same_bytes_as"] = first.label
            if buffer in duplicates.shared:
                row.detail["shared_with"] = duplicates.shared[buffer]
        elif "segment" in row.detail and row.kind in ("delegate_weight", "named_data"):
            first = duplicates.copy_of.get(("segment", row.detail["segment"]))
            if first is not None:
                row.detail["same_bytes_as"] = first.label


class _Gaps:
    """Bytes between regions: padding, named by where they are."""

    def __init__(self, ledger: Ledger, pf: ProgramFile) -> None:
        self.ledger = ledger
        self.program_size = pf.program_size
        spans = [(s, s + size) for s, size in pf.segment_spans if size]
        self.first = min((s for s, _ in spans), default=None)
        self.last = max((e for _, e in spans), default=None)

    def charge(self, start: int, end: int) -> None:
        if self.last is not None and start >= self.last:
            item = "after the last segment"
        elif start >= self.program_size and (self.first is None or end <= self.first):
            item = "between the program and the first segment"
        else:
            item = "between segments"
        self.ledger.charge(self.ledger.declare(("gap", item), "padding", item, "padding"),
                           end - start)


# --------------------------------------------------------------------------
# Segments.
# --------------------------------------------------------------------------


class _Segments:
    """The rows of each segment, by what it holds: declared in index order,
    filled in file order."""

    def __init__(self, ledger: Ledger, view: memoryview, program: P.Program,
                 stored: StoredBuffers, delegates: DelegateSizes) -> None:
        self.ledger = ledger
        self.view = view
        self.program = program
        self.stored = stored
        self.delegates = delegates
        self.roles = segment_roles(program)
        self.keys: dict[int, list[str]] = {}  # segment -> the named-data keys naming it
        for named in program.named_data:
            self.keys.setdefault(named.segment_index, []).append(named.key)
        self.tables: dict[int, list[tuple[int | None, list[int]]]] = {}  # stored buffer tables
        if program.constant_segment is not None and program.constant_segment.offsets:
            self.tables.setdefault(program.constant_segment.segment_index, []).append(
                (None, program.constant_segment.offsets))
        for j, sub in enumerate(program.mutable_data_segments):
            self.tables.setdefault(sub.segment_index, []).append((j, sub.offsets))
        self.payloads: dict[int, Fill] = {}  # delegate payload segments, declared already

    def role(self, index: int) -> str:
        return self.roles.get(index, "unused")

    def group(self, index: int) -> str:
        return f"segment {index}: {self.role(index)}"

    def declare(self, index: int, start: int, size: int) -> None:
        role, group = self.role(index), self.group(index)
        # An XNNPACK payload, and the named data it reads, are the delegate's.
        if role.startswith("delegate:"):
            fill = self.delegates.segment_fill(self.ledger, index, start, group)
            if fill is not None:
                self.payloads[index] = fill
                return
        elif role == "named_data" and \
                self.delegates.weights_fill(self.ledger, index, start, size) is not None:
            return
        if role in ("constants", "mutable_data"):
            for table, offsets in self.tables.get(index, []):
                for i in range(len(offsets)):
                    if self.ledger.full:
                        break  # the rest are summed: no need to name them
                    self.stored.declare(self.ledger, ("stored", table, i), group, table, i)
            self.ledger.declare(("segment padding", index), group, "alignment padding",
                                "padding", segment=index)
            return
        self.ledger.declare(("segment", index), group, self._whole_item(index, role),
                            _whole_segment_kind(role), segment=index)

    def fill(self, index: int, start: int, size: int) -> Fill:
        role = self.role(index)
        if index in self.payloads:
            return self.payloads[index]
        if role == "named_data":
            fill = self.delegates.weights_fill(self.ledger, index, start, size)
            if fill is not None:
                return fill
        if role not in ("constants", "mutable_data"):
            kind = _whole_segment_kind(role)
            return self.ledger.fill(self.ledger.lookup(("segment", index), kind))
        tables = self.tables.get(index, [])

        def claims() -> Iterator[Claim]:
            for table, offsets in tables:
                kind = "constant" if table is None else "mutable_data"
                # In offset order (a malformed file's may not be).
                for i in numpy.argsort(numpy.array(offsets, dtype=numpy.int64),
                                       kind="stable").tolist():
                    lo, hi = P.constant_span(offsets, i, size)
                    used = self.stored.tensor_bytes(table, i, hi - lo)
                    yield start + lo, start + lo + used, self.ledger.lookup(
                        ("stored", table, i), kind)
        padding = self.ledger.lookup(("segment padding", index), "padding")
        return self.ledger.fill_claims(claims, padding)

    def _whole_item(self, index: int, role: str) -> str:
        if role == "named_data":
            keys = self.keys.get(index, [])
            shown = ", ".join(repr(key) for key in keys[:8])
            return "named data " + shown + (f", ... {len(keys) - 8} more" if len(keys) > 8
                                             else "")
        if role.startswith("delegate:"):
            return f"delegate {role.partition(':')[2]} data"
        return "unused segment (nothing refers to it)"


def _whole_segment_kind(role: str) -> str:
    return "delegate_data" if role.startswith("delegate:") else role
