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
first operator using it. Identical
constant bytes stored at more than one `data_buffer_idx` are reported as
duplicates, with the bytes deduplication would save.

This module sweeps the file; the pieces it uses are `size_rows` (the report),
`size_ledger` (charging bytes to rows), `size_flatbuffer` (the FlatBuffer's
spans), `size_stored_buffers` and `size_constant_names` (constants, their
names and duplicates); `size_text` renders the report.
"""

from __future__ import annotations

from collections.abc import Sequence

from exirc.inspector.describe import segment_roles
from exirc.inspector.size_constant_names import DEFAULT_NAME_SOURCES, NameSource, stored_names
from exirc.inspector.size_delegates import DelegateSizes
from exirc.inspector.size_flatbuffer import flatbuffer_claims
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
    regions: list[tuple[int, int, Fill]] = []

    prefix = ledger.declare(("prefix",), "header", "root offset and file identifier",
                            "identifier")
    regions.append((0, HEADER_OFFSET, ledger.fill(prefix)))
    flatbuffer_start = HEADER_OFFSET
    if pf.header is not None:
        header = ledger.declare(("header",), "header", "extended header", "header")
        flatbuffer_start += pf.header.length
        regions.append((HEADER_OFFSET, flatbuffer_start, ledger.fill(header)))
    claims, padding = flatbuffer_claims(ledger, view[:pf.program_size], pf.program, stored,
                                        delegates)
    regions.append((flatbuffer_start, pf.program_size, ledger.fill_claims(claims, padding)))
    roles = segment_roles(pf.program)
    for index, (start, size) in enumerate(pf.segment_spans):
        if size:
            fill = _segment_fill(ledger, view, pf.program, index, start, size,
                                 roles.get(index, "unused"), stored, delegates)
            regions.append((start, start + size, fill))

    # Regions in file order; a byte already charged by an earlier region
    # (overlapping segments in a malformed file) is not charged again.
    cursor = 0
    for start, end, fill in sorted(regions, key=lambda r: (r[0], r[1])):
        if start > cursor:
            _charge_gap(ledger, cursor, min(start, pf.file_size), pf)
        if end > cursor:
            fill(max(start, cursor), end)
            cursor = end
    if cursor < pf.file_size:
        _charge_gap(ledger, cursor, pf.file_size, pf)

    duplicates = stored.duplicates()
    for duplicate in duplicates:
        first, *others = duplicate.buffers
        for row in ledger.rows.values():
            if row.kind == "constant" and row.detail.get("buffer") in others:
                row.detail["duplicate_of"] = first
    rows = [row for row in ledger.rows.values() if row.nbytes]
    return SizeReport(pf.file_size, rows, duplicates)


def _charge_gap(ledger: Ledger, start: int, end: int, pf: ProgramFile) -> None:
    segments = [(s, s + size) for s, size in pf.segment_spans if size]
    if segments and start >= max(e for _, e in segments):
        item = "after the last segment"
    elif start >= pf.program_size and (not segments or end <= min(s for s, _ in segments)):
        item = "between the program and the first segment"
    else:
        item = "between segments"
    ledger.charge(ledger.declare(("gap", item), "padding", item, "padding"), end - start)


# --------------------------------------------------------------------------
# Segments.
# --------------------------------------------------------------------------


def _segment_fill(ledger: Ledger, view: memoryview, program: P.Program, index: int,
                  start: int, size: int, role: str, stored: StoredBuffers,
                  delegates: DelegateSizes) -> Fill:
    group = f"segment {index}: {role}"
    # An XNNPACK payload, and the named data it reads, are the delegate's.
    fill = delegates.segment_fill(ledger, index, start, group) \
        if role.startswith("delegate:") else \
        delegates.weights_fill(ledger, index, start, size) \
        if role == "named_data" else None
    if fill is not None:
        return fill
    if role == "constants":
        assert program.constant_segment is not None  # that is what the role says
        tables: list[tuple[int | None, list[int]]] = [(None, program.constant_segment.offsets)]
    elif role == "mutable_data":
        tables = [(j, sub.offsets) for j, sub in enumerate(program.mutable_data_segments)
                  if sub.segment_index == index]
    else:
        return ledger.fill(ledger.declare(("segment", index), group,
                                          _whole_segment_item(program, index, role),
                                          _whole_segment_kind(role), segment=index))
    claims: list[Claim] = []
    for table, offsets in tables:
        for i in range(len(offsets)):
            lo, hi = P.constant_span(offsets, i, size)
            used = stored.tensor_bytes(table, i, hi - lo)
            data = view[start + lo:start + lo + used]
            key = stored.declare(ledger, ("stored", table, i), group, table, i, data)
            claims.append((start + lo, start + lo + used, key))
    claims.sort(key=lambda c: c[0])
    padding = ledger.declare(("segment padding", index), group, "alignment padding",
                             "padding", segment=index)
    return ledger.fill_claims(claims, padding)


def _whole_segment_item(program: P.Program, index: int, role: str) -> str:
    if role == "named_data":
        keys = [repr(n.key) for n in program.named_data if n.segment_index == index]
        return "named data " + ", ".join(keys)
    if role.startswith("delegate:"):
        return f"delegate {role.partition(':')[2]} data"
    return "unused segment (nothing refers to it)"


def _whole_segment_kind(role: str) -> str:
    return "delegate_data" if role.startswith("delegate:") else role
