"""The size report's view of the FlatBuffer: spans recorded while decoding it,
charged to the part of the program their field path names.
"""

from __future__ import annotations

import re

from exirc.inspector.render import plural
from exirc.inspector.size_ledger import Claim, Ledger, RowKey
from exirc.inspector.size_stored_buffers import StoredBuffers
from exirc.serialize import program as P
from exirc.serialize.checked_buffer import CheckedBuffer, TableView
from exirc.serialize.decode import decode_program, segment_ranges

PROGRAM_GROUP = "program (FlatBuffer)"


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


def flatbuffer_claims(ledger: Ledger, program_bytes: memoryview, program: P.Program,
                       stored: StoredBuffers) -> tuple[list[Claim], RowKey]:
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


def _declare_program_rows(ledger: Ledger, program: P.Program) -> None:
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
