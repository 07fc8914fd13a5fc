"""The size report's view of the FlatBuffer: spans recorded while decoding it,
charged to the part of the program their field path names.
"""

from __future__ import annotations

import re

from exirc.inspector.render import plural
from exirc.inspector.size_delegates import DelegateSizes
from exirc.inspector.size_ledger import Claim, Ledger, RowKey
from exirc.inspector.size_spans import SpanRecorder
from exirc.inspector.size_stored_buffers import StoredBuffers
from exirc.serialize import program as P
from exirc.serialize.decode import decode_program, segment_ranges

PROGRAM_GROUP = "program (FlatBuffer)"


_PLAN_FIELD = re.compile(r"root\.execution_plan\[(\d+)\](?:\.(\w+)(.*))?$")
_METHOD_PARTS = ("values", "instructions", "stacktrace", "operators", "delegates",
                 "container_meta_type", "other")


def flatbuffer_claims(ledger: Ledger, program_bytes: memoryview, program: P.Program,
                      stored: StoredBuffers,
                      delegates: DelegateSizes | None = None) -> tuple[list[Claim], RowKey]:
    """Claims on the FlatBuffer's bytes, and the row of its unclaimed bytes;
    inline XNNPACK payloads are charged part by part (`delegates`)."""
    recorder = SpanRecorder(program_bytes)
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
    if delegates is not None:
        claims = _inline_payload_claims(ledger, claims, inline_keys, delegates)
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


def _inline_payload_claims(ledger: Ledger, claims: list[Claim], inline_keys: dict[str, RowKey],
                           delegates: DelegateSizes) -> list[Claim]:
    """`claims` with each inline XNNPACK payload's one claim split into its parts."""
    out: list[Claim] = []
    for start, end, key in claims:
        payload = delegates.payload(P.DataLocation.INLINE, key[1]) \
            if key[0] == "inline delegate" else None
        found = None if payload is None or end - start != len(payload.data) else \
            delegates.payload_claims(ledger, start, payload, PROGRAM_GROUP)
        out.extend([(start, end, key)] if found is None else found[0])
    return out
