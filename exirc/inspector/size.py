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
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exirc.inspector.describe import segment_roles
from exirc.inspector.listing import value_type
from exirc.inspector.memory_report import touched_values
from exirc.inspector.render import Style, clean, compact_bytes, human_bytes, plural
from exirc.serialize import ProgramFile, constant_names, read_program_file
from exirc.serialize import program as P
from exirc.serialize.checked_buffer import CheckedBuffer, TableView
from exirc.serialize.decode import decode_program, segment_ranges
from exirc.serialize.header import HEADER_OFFSET

# Constant rows listed per group in the text view; the rest are summed.
MAX_CONSTANT_ROWS = 8
PROGRAM_GROUP = "program (FlatBuffer)"


# --------------------------------------------------------------------------
# Report data.
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# Constant names: pluggable.
# --------------------------------------------------------------------------


@dataclass
class ConstantUse:
    """The first tensor value reading a stored buffer (constant or mutable data)."""

    method: str
    value: int
    tensor: P.Tensor
    user: str | None  # the first operator (or delegate) whose call uses it
    tensors: int = 1  # how many tensor values (in all methods) read the buffer


NameSource = Callable[[ConstantUse], "str | None"]


def fully_qualified_name(use: ConstantUse) -> str | None:
    extra = use.tensor.extra_tensor_info
    return extra.fully_qualified_name if extra is not None else None


DEFAULT_NAME_SOURCES: tuple[NameSource, ...] = (fully_qualified_name,)


def stored_names(program: P.Program) -> NameSource:
    """Names from the compiler's `exirc.serialize.constant_names` segment, if the file has one."""
    data = program.named_segment(constant_names.NAMED_DATA_KEY)
    names = constant_names.decode(data) if data is not None else {}

    def name(use: ConstantUse) -> str | None:
        listed = names.get(use.tensor.data_buffer_idx) if use.tensor.data_buffer_idx else None
        return " = ".join(listed) if listed else None
    return name


def constant_name(use: ConstantUse, sources: Sequence[NameSource]) -> str | None:
    for source in sources:
        name = source(use)
        if name:
            return name
    return None


# --------------------------------------------------------------------------
# The report.
# --------------------------------------------------------------------------

RowKey = tuple[Any, ...]
Claim = tuple[int, int, RowKey]  # [start, end) in the file, and the row it goes to
Fill = Callable[[int, int], None]  # charges the bytes [start, end) of a region


class _Ledger:
    """Rows in the order they are declared, and the bytes charged to each."""

    def __init__(self) -> None:
        self.rows: dict[RowKey, SizeRow] = {}

    def declare(self, key: RowKey, group: str, item: str, kind: str,
                **detail: Any) -> RowKey:
        if key not in self.rows:
            self.rows[key] = SizeRow(group, item, kind, 0, detail)
        return key

    def charge(self, key: RowKey, nbytes: int) -> None:
        self.rows[key].nbytes += nbytes

    def fill(self, key: RowKey) -> Fill:
        """A region charged entirely to one row."""
        return lambda start, end: self.charge(key, end - start)

    def fill_claims(self, claims: list[Claim], rest: RowKey) -> Fill:
        """A region charged to `claims` (sorted by start), the slack to `rest`."""
        return lambda start, end: _charge_claims(self, start, end, claims, rest)


def size_report(data: bytes | memoryview, program_file: ProgramFile | None = None, *,
                name_sources: Sequence[NameSource] = DEFAULT_NAME_SOURCES) -> SizeReport:
    """Attribute every byte of the file `data`; `program_file` is its parse,
    if already read."""
    view = memoryview(data)
    pf = program_file if program_file is not None else read_program_file(view)
    ledger = _Ledger()
    stored = _StoredBuffers(pf.program, (stored_names(pf.program), *name_sources))
    regions: list[tuple[int, int, Fill]] = []

    prefix = ledger.declare(("prefix",), "header", "root offset and file identifier",
                            "identifier")
    regions.append((0, HEADER_OFFSET, ledger.fill(prefix)))
    flatbuffer_start = HEADER_OFFSET
    if pf.header is not None:
        header = ledger.declare(("header",), "header", "extended header", "header")
        flatbuffer_start += pf.header.length
        regions.append((HEADER_OFFSET, flatbuffer_start, ledger.fill(header)))
    claims, padding = _flatbuffer_claims(ledger, view[:pf.program_size], pf.program, stored)
    regions.append((flatbuffer_start, pf.program_size, ledger.fill_claims(claims, padding)))
    roles = segment_roles(pf.program)
    for index, (start, size) in enumerate(pf.segment_spans):
        if size:
            fill = _segment_fill(ledger, view, pf.program, index, start, size,
                                 roles.get(index, "unused"), stored)
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


def _charge_claims(ledger: _Ledger, start: int, end: int, claims: list[Claim],
                   rest: RowKey) -> None:
    """Each byte of [start, end) to the first claim covering it; the bytes no
    claim covers to `rest`."""
    owned = 0
    cursor = start
    for claim_start, claim_end, key in claims:
        if claim_start >= end:
            break
        lo, hi = max(claim_start, cursor), min(claim_end, end)
        if hi > lo:
            ledger.charge(key, hi - lo)
            owned += hi - lo
            cursor = hi
    if end - start > owned:
        ledger.charge(rest, end - start - owned)


def _charge_gap(ledger: _Ledger, start: int, end: int, pf: ProgramFile) -> None:
    segments = [(s, s + size) for s, size in pf.segment_spans if size]
    if segments and start >= max(e for _, e in segments):
        item = "after the last segment"
    elif start >= pf.program_size and (not segments or end <= min(s for s, _ in segments)):
        item = "between the program and the first segment"
    else:
        item = "between segments"
    ledger.charge(ledger.declare(("gap", item), "padding", item, "padding"), end - start)


# --------------------------------------------------------------------------
# Stored buffers (constants, mutable data): uses, names, duplicates.
# --------------------------------------------------------------------------


class _StoredBuffers:
    def __init__(self, program: P.Program, name_sources: Sequence[NameSource]) -> None:
        self.uses = stored_buffer_uses(program)
        self.name_sources = name_sources
        self.methods = len(program.execution_plan)
        # (digest, length) -> constant buffer indices with those bytes
        self.contents: dict[tuple[bytes, int], set[int]] = {}

    def use(self, table: int | None, index: int) -> ConstantUse | None:
        return self.uses.get(table, {}).get(index)

    def tensor_bytes(self, table: int | None, index: int, available: int) -> int:
        """Bytes of a buffer its tensor uses (the rest is padding); all if unused."""
        use = self.use(table, index)
        return available if use is None else min(use.tensor.nbytes, available)

    def declare(self, ledger: _Ledger, key: RowKey, group: str, table: int | None,
                index: int, data: bytes | memoryview) -> RowKey:
        """The row of stored buffer `index` of `table` (None: the constants),
        whose tensor's bytes are `data`."""
        kind = "constant" if table is None else "mutable_data"
        if table is None and len(data):
            digest = hashlib.sha256(data).digest()
            self.contents.setdefault((digest, len(data)), set()).add(index)
        use = self.use(table, index)
        label = f"constant {index}" if table is None else f"mutable data {table}/{index}"
        if use is None:
            return ledger.declare(key, group, f"{label}: not used by any tensor", kind,
                                  buffer=index, table=table)
        name = constant_name(use, self.name_sources)
        tensor_type = value_type(use.tensor)
        where = f" of {use.method}" if self.methods > 1 else ""
        if name:
            item = f"{label}: {name} {tensor_type}"
        else:
            used_by = f" used by {use.user}" if use.user else ""
            item = f"{label}: %{use.value}{where} {tensor_type}{used_by}"
        if use.tensors > 1:
            item += f" (+{plural(use.tensors - 1, 'more tensor')})"
        return ledger.declare(key, group, item, kind, buffer=index, table=table,
                              method=use.method, value=use.value, type=tensor_type, name=name,
                              used_by=use.user, tensors=use.tensors)

    def duplicates(self) -> list[DuplicateConstants]:
        found = [DuplicateConstants(sorted(indices), size)
                 for (_, size), indices in self.contents.items() if len(indices) > 1]
        return sorted(found, key=lambda d: (-d.saving, d.buffers))


def stored_buffer_uses(program: P.Program) -> dict[int | None, dict[int, ConstantUse]]:
    """The first use of each stored buffer: under None the constants by
    data_buffer_idx, under j those of mutable data segment table j."""
    found: dict[int | None, dict[int, ConstantUse]] = {}
    for plan in program.execution_plan:
        users = first_users(plan)
        for index, value in enumerate(plan.values):
            if not isinstance(value, P.Tensor) or not value.data_buffer_idx:
                continue
            table: int | None = None
            if value.allocation_info is not None:
                # Planned memory with stored data is mutable state: its
                # initial value lives in a mutable data segment.
                extra = value.extra_tensor_info
                table = extra.mutable_data_segments_idx if extra is not None else 0
            table_uses = found.setdefault(table, {})
            use = table_uses.get(value.data_buffer_idx)
            if use is None:
                table_uses[value.data_buffer_idx] = ConstantUse(plan.name, index, value,
                                                                users.get(index))
            else:
                use.tensors += 1  # e.g. ExecuTorch stores equal parameters once
    return found


def first_users(plan: P.ExecutionPlan) -> dict[int, str]:
    """Value index -> the first operator or delegate whose call uses it."""
    users: dict[int, str] = {}
    for chain in plan.chains:
        for instr in chain.instructions:
            if isinstance(instr, P.KernelCall):
                name = plan.operators[instr.op_index].qualified_name
            elif isinstance(instr, P.DelegateCall):
                name = f"delegate {plan.delegates[instr.delegate_index].id}"
            else:
                continue
            for index in touched_values(plan, instr):
                users.setdefault(index, name)
    return users


# --------------------------------------------------------------------------
# Segments.
# --------------------------------------------------------------------------


def _segment_fill(ledger: _Ledger, view: memoryview, program: P.Program, index: int,
                  start: int, size: int, role: str, stored: _StoredBuffers) -> Fill:
    group = f"segment {index}: {role}"
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


# --------------------------------------------------------------------------
# The FlatBuffer: spans recorded while decoding, charged by field path.
# --------------------------------------------------------------------------


class _SpanRecorder(CheckedBuffer):
    """A checked reader that records (start, end, field path) of each object."""

    def __init__(self, data: bytes | memoryview) -> None:
        super().__init__(data)
        self.spans: list[tuple[int, int, str]] = []

    def table_at(self, pos: int, path: str) -> TableView:
        view = super().table_at(pos, path)
        self.spans.append((pos, pos + view.table_len, path))
        self.spans.append((view.vtable, view.vtable + view.vtable_len, path))
        return _RecordingTable(self, view.pos, view.vtable, view.vtable_len, view.table_len,
                               path)


class _RecordingTable(TableView):
    __slots__ = ()

    def _vector(self, slot: int, elem_size: int, name: str) -> tuple[int, int, str] | None:
        found = super()._vector(slot, elem_size, name)
        if found is not None:
            start, count, path = found
            spans = self._spans()
            # The length prefix apart, so inline data can be charged alone.
            spans.append((start - 4, start, path + "#length"))
            spans.append((start, start + count * elem_size, path))
        return found

    def string(self, slot: int, name: str) -> str | None:
        text = super().string(slot, name)
        if text is not None:
            # `_vector` just recorded the string's bytes; add its terminator.
            spans = self._spans()
            _, end, path = spans[-1]
            spans.append((end, end + 1, path))
        return text

    def _spans(self) -> list[tuple[int, int, str]]:
        assert isinstance(self.buf, _SpanRecorder)
        return self.buf.spans


_PLAN_FIELD = re.compile(r"root\.execution_plan\[(\d+)\](?:\.(\w+)(.*))?$")
_METHOD_PARTS = ("values", "instructions", "stacktrace", "operators", "delegates",
                 "container_meta_type", "other")


def _flatbuffer_claims(ledger: _Ledger, program_bytes: memoryview, program: P.Program,
                       stored: _StoredBuffers) -> tuple[list[Claim], RowKey]:
    """Claims on the FlatBuffer's bytes, and the row of its unclaimed bytes."""
    recorder = _SpanRecorder(program_bytes)
    decode_program(recorder)
    segment_ranges(recorder)  # the segment table, which decode_program skips
    _declare_program_rows(ledger, program)
    inline_keys: dict[str, RowKey] = {}
    for i, buffer in enumerate(program.constant_buffer):
        used = stored.tensor_bytes(None, i, len(buffer.storage))
        inline_keys[f"root.constant_buffer[{i}].storage"] = stored.declare(
            ledger, ("stored", "inline", i), PROGRAM_GROUP, None, i, buffer.storage[:used])
    for i in range(len(program.backend_delegate_data)):
        ids = sorted({d.id for plan in program.execution_plan for d in plan.delegates
                      if d.processed.location == P.DataLocation.INLINE and d.processed.index == i})
        inline_keys[f"root.backend_delegate_data[{i}].data"] = ledger.declare(
            ("inline delegate", i), PROGRAM_GROUP,
            f"inline delegate data {i}" + (f" ({', '.join(ids)})" if ids else ""),
            "delegate_data", index=i, delegates=ids)
    padding = ledger.declare(("flatbuffer padding",), PROGRAM_GROUP,
                             "alignment padding (and unknown fields)", "padding")
    claims = [(start, end, inline_keys.get(path) or _classify(path))
              for start, end, path in recorder.spans]
    # Inline constant bytes past the tensor's own (alignment slack) are padding.
    for i, buffer in enumerate(program.constant_buffer):
        spare = len(buffer.storage) - stored.tensor_bytes(None, i, len(buffer.storage))
        if spare:
            claims = [(s, e - spare, key) if key == ("stored", "inline", i) else (s, e, key)
                      for s, e, key in claims]
    claims.sort(key=lambda c: c[0])  # stable: among equal starts the first recorded wins
    return claims, padding


def _declare_program_rows(ledger: _Ledger, program: P.Program) -> None:
    """Declare the FlatBuffer's rows up front, so they list in a fixed order."""
    for i, plan in enumerate(program.execution_plan):
        counts = {
            "values": plural(len(plan.values), "value"),
            "instructions": plural(sum(len(c.instructions) for c in plan.chains),
                                   "instruction"),
            "stacktrace": plural(sum(len(f.items) for c in plan.chains for f in c.stacktrace),
                                 "frame"),
            "operators": plural(len(plan.operators), "operator"),
            "delegates": plural(len(plan.delegates), "delegate"),
        }
        labels = {"stacktrace": "stack traces", "container_meta_type": "input/output specs",
                  "other": "other plan tables"}
        for part in _METHOD_PARTS:
            label = labels.get(part, part)
            item = f"{plan.name}: {label}" + (f" ({counts[part]})" if part in counts else "")
            kind = "plan_other" if part == "other" else part
            ledger.declare(("method", i, part), PROGRAM_GROUP, item, kind, method=plan.name)
    for part, item in (("root", "program root, version, plan list"),
                       ("constants", "constant tables (offsets, inline buffer tables)"),
                       ("segments", "segment, mutable data and named data tables"),
                       ("delegates", "inline delegate data tables")):
        ledger.declare(("tables", part), PROGRAM_GROUP, item, "program_other")


def _classify(path: str) -> RowKey:
    """The row of a FlatBuffer object, from its field path."""
    path = path.partition("#")[0]
    plan = _PLAN_FIELD.match(path)
    if plan is not None:
        index, name, rest = int(plan[1]), plan[2], plan[3] or ""
        if name in ("values", "operators", "delegates", "container_meta_type"):
            return ("method", index, name)
        if name == "chains" and ".instructions" in rest:
            return ("method", index, "instructions")
        if name == "chains" and ".stacktrace" in rest:
            return ("method", index, "stacktrace")
        return ("method", index, "other")
    for prefix, part in (("root.constant_", "constants"), ("root.segments", "segments"),
                         ("root.mutable_data_segments", "segments"),
                         ("root.named_data", "segments"),
                         ("root.backend_delegate_data", "delegates")):
        if path.startswith(prefix):
            return ("tables", part)
    return ("tables", "root")


# --------------------------------------------------------------------------
# Text.
# --------------------------------------------------------------------------


def render_size(report: SizeReport, bold: Style, *, path: str | None = None) -> str:
    total = max(report.file_size, 1)
    name = clean(path or "<bytes>")
    # (label, bytes, note after the figures, is a heading)
    table: list[tuple[str, int, str, bool]] = []
    for group, rows in _groups(report.rows):
        table.append((clean(group), sum(r.nbytes for r in rows), "", True))
        table.extend(("  " + clean(label), nbytes, note, False)
                     for label, nbytes, note in _shown_rows(rows))
    table.append(("total", sum(r.nbytes for r in report.rows), "", True))
    width = min(max(len(label) for label, _, _, _ in table), 60)
    lines = [bold(f"size of {name}: ") + compact_bytes(report.file_size)]
    for label, nbytes, note, heading in table:
        if len(label) > width:
            label = label[:width - 3] + "..."
        text = f"  {label:<{width}}  {_size_columns(nbytes)}  {100 * nbytes / total:5.1f}%"
        text = bold(text) if heading else text
        lines.append(f"{text}  {note}" if note else text)
    lines.append(_render_duplicates(report))
    return "\n".join(lines)


def _size_columns(nbytes: int) -> str:
    """The human size, and the exact count when the human form rounds."""
    exact = f"({nbytes:,} B)" if nbytes >= 1024 else ""
    return f"{human_bytes(nbytes):>9} {exact:>13}"


def _groups(rows: list[SizeRow]) -> list[tuple[str, list[SizeRow]]]:
    groups: dict[str, list[SizeRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    return list(groups.items())


def _shown_rows(rows: list[SizeRow]) -> list[tuple[str, int, str]]:
    """(label, bytes, note) of a group's rows as listed: stored buffers
    largest first and cut to one screen, the others in file order."""
    stored = [r for r in rows if r.kind in ("constant", "mutable_data")]
    shown = sorted(stored, key=lambda r: -r.nbytes)[:MAX_CONSTANT_ROWS]
    rest = [r for r in stored if r not in shown]
    out = []
    for row in rows:
        if row in rest:
            continue
        note = f"duplicate of {row.detail['duplicate_of']}" if "duplicate_of" in row.detail \
            else ""
        out.append((row.item, row.nbytes, note))
    if rest:
        out.append((f"... {plural(len(rest), 'more buffer')} (see --json)",
                    sum(r.nbytes for r in rest), ""))
    return out


def _render_duplicates(report: SizeReport) -> str:
    if not report.duplicates:
        return "duplicated constants: none"
    parts = [f"buffers {', '.join(map(str, d.buffers))} ({human_bytes(d.nbytes)} each)"
             for d in report.duplicates[:MAX_CONSTANT_ROWS]]
    more = len(report.duplicates) - MAX_CONSTANT_ROWS
    if more > 0:
        parts.append(f"{more} more")
    return (f"duplicated constants: {'; '.join(parts)}; storing each once would save "
            f"{compact_bytes(report.duplicate_bytes)}")
