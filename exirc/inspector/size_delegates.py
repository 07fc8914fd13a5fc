"""Delegate payloads in the size report: what an XNNPACK payload's bytes are,
and which named data are its weights.

An XNNPACK payload is a header, a FlatBuffer graph and a constant region
(`exirc.serialize.xnnpack.header`). The graph is decoded again with the
span-recording reader the program's FlatBuffer uses, so its bytes are
charged to the delegate's nodes, values and constant table; each constant
in the region to the weight it is. Bytes nothing claims are the payload's
alignment padding.

ExecuTorch keeps the weights in the program's named data instead, one
segment per weight; those segments are charged to the delegate reading
them, as its weights, rather than to anonymous named data. A weight several
delegates read is stored once, so it is charged once: to the first, and the
row says who else reads it. Payloads that do not read, and other backends',
stay one row each.
"""

from __future__ import annotations

from exirc.inspector.delegates import (
    Payload,
    program_payloads,
    weight_segments,
)
from exirc.inspector.render import plural
from exirc.inspector.size_ledger import Claim, Fill, Ledger, RowKey
from exirc.inspector.size_spans import SpanRecorder
from exirc.serialize import program as P
from exirc.serialize.xnnpack.header import XnnpackHeader
from exirc.serialize.xnnpack.reader import ROOT, decode_graph


class DelegateSizes:
    """Every delegate payload of a program, read once for the whole report."""

    def __init__(self, program: P.Program) -> None:
        self.payloads = program_payloads(program)
        self.readers = weight_segments(program, self.payloads)
        self.segment_keys: dict[int, list[str]] = {}
        for named in program.named_data:
            self.segment_keys.setdefault(named.segment_index, []).append(named.key)
        # (location, index) of the bytes -> the first delegate using them
        self.by_data: dict[tuple[P.DataLocation, int], Payload] = {}
        for payload in self.payloads:
            ref = payload.delegate.processed
            self.by_data.setdefault((ref.location, ref.index), payload)

    def payload(self, location: P.DataLocation, index: int) -> Payload | None:
        return self.by_data.get((location, index))

    def payload_claims(self, ledger: Ledger, base: int, payload: Payload,
                       group: str) -> tuple[list[Claim], RowKey] | None:
        """Claims covering every byte of `payload`, which starts at file offset
        `base`, and its padding row; None when it is not an XNNPACK payload
        that reads."""
        if payload.blob is None:
            return None
        label = f"{payload.method} delegate[{payload.index}]"

        def row(part: str, item: str, kind: str) -> RowKey:
            return ledger.declare(("payload", base, part), group, f"{label}: {item}", kind,
                                  method=payload.method, delegate=payload.index)

        data = payload.data
        header = XnnpackHeader.parse(data)  # it read, so this does too
        claims: list[Claim] = []
        if header is None:  # a bare FlatBuffer (constants inside it, if any)
            fb_start, fb_size = 0, len(data)
        else:
            fb_start, fb_size = header.flatbuffer_offset, header.flatbuffer_size
            claims.append((base, base + header.length,
                           row("header", "payload header", "delegate_header")))
        graph = payload.blob.graph
        parts = {
            "nodes": row("nodes", f"XNNPACK nodes ({len(graph.nodes)})", "delegate_graph"),
            "values": row("values", f"XNNPACK values ({len(graph.values)})", "delegate_graph"),
            "constant_data": row("constant_data", "constant data table "
                                 f"({len(graph.constant_data)} entries)", "delegate_graph"),
            "legacy": row("legacy", "constants inside the graph (legacy constant_buffer)",
                          "delegate_weight"),
            "graph": row("graph", "graph root, version, input/output ids", "delegate_graph"),
        }
        fb_base = base + fb_start
        claims.append((fb_base, fb_base + 8, parts["graph"]))  # root offset, identifier
        for start, end, path in _graph_spans(data[fb_start:fb_start + fb_size],
                                             legacy=header is None):
            claims.append((fb_base + start, fb_base + end, parts[_part(path)]))
        if header is not None:
            region = base + header.constant_data_offset
            for weight in payload.weights:
                if weight.named_key is None:
                    key = ledger.declare(("payload", base, "weight", weight.offset), group,
                                         f"{label}: {weight.label}", "delegate_weight",
                                         method=payload.method, delegate=payload.index,
                                         type=weight.type, role=weight.role)
                    start = region + weight.offset
                    claims.append((start, start + weight.nbytes, key))
        padding = row("padding", "payload padding (and unknown fields)", "padding")
        return _tile(claims, base, base + len(data), padding), padding

    def segment_fill(self, ledger: Ledger, index: int, start: int, group: str) -> Fill | None:
        """The fill of delegate payload segment `index`, if XNNPACK's and readable."""
        payload = self.payload(P.DataLocation.SEGMENT, index)
        found = None if payload is None else self.payload_claims(ledger, start, payload, group)
        return None if found is None else ledger.fill_claims(*found)

    def weights_fill(self, ledger: Ledger, index: int, start: int, size: int) -> Fill | None:
        """The fill of named-data segment `index`, if a delegate reads it as weights."""
        found = self.readers.get(index)
        if found is None or not found.first:
            return None
        readers = found.first
        owner = readers[0]
        weights = [owner.named_weights[key] for key in self.segment_keys.get(index, [])
                   if key in owner.named_weights]
        if not weights:
            return None
        group = f"{owner.label}: weights (named data)"
        weight = weights[0]
        item = weight.label
        if len(weights) > 1:
            item += f" (+{plural(len(weights) - 1, 'more key')})"
        # Stored once, charged once: to the first reader; the text shows the others.
        others = [f"{p.method} delegate[{p.index}]" for p in readers[1:]]
        if found.count > len(readers):
            others.append(f"{found.count - len(readers)} more delegates")
        key = ledger.declare(("delegate weight", index), group, item, "delegate_weight",
                             segment=index, named_key=weight.named_key, method=owner.method,
                             delegate=owner.index, type=weight.type, role=weight.role,
                             shared_with=others)
        used = min(max(w.nbytes for w in weights), size)
        padding = ledger.declare(("delegate weight padding", owner.method, owner.index), group,
                                 "slack after weights (stored beyond their size)", "padding")
        return ledger.fill_claims([(start, start + used, key)], padding)


def _graph_spans(flatbuffer: memoryview, *, legacy: bool) -> list[tuple[int, int, str]]:
    """(start, end, field path) of every object of an XNNPACK graph's FlatBuffer.

    It reads exactly what `deserialize_blob` read (the legacy constant_buffer
    only in a payload without a header), so bytes that read then read now."""
    recorder = SpanRecorder(flatbuffer)
    root = recorder.table_at(recorder.follow(0, ROOT), ROOT)
    decode_graph(root)
    if legacy:
        for table in root.tables(6, "constant_buffer"):
            table.byte_vector(0, "storage")
    return recorder.spans


def _part(path: str) -> str:
    for prefix, part in ((f"{ROOT}.xnodes", "nodes"), (f"{ROOT}.xvalues", "values"),
                         (f"{ROOT}.constant_data", "constant_data")):
        if path.startswith(prefix):
            return part
    if path.startswith(f"{ROOT}.constant_buffer") and path.endswith(".storage"):
        return "legacy"  # the bytes; their tables and length prefixes are the graph's
    return "graph"


def _tile(claims: list[Claim], start: int, end: int, rest: RowKey) -> list[Claim]:
    """`claims` sorted, with the bytes of [start, end) none covers claimed by
    `rest`, so they cover the range wherever they are charged (a segment, or
    inline data inside the program's FlatBuffer)."""
    claims = sorted(claims, key=lambda c: c[0])  # stable: the first recorded wins a tie
    tiled: list[Claim] = []
    cursor = start
    for claim in claims:
        if claim[0] > cursor:
            tiled.append((cursor, min(claim[0], end), rest))
        tiled.append(claim)
        cursor = max(cursor, claim[1])
    if cursor < end:
        tiled.append((cursor, end, rest))
    return tiled
