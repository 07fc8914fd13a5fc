"""Delegate payloads in the size report: what an XNNPACK payload's bytes are,
and which named data are its weights.

An XNNPACK payload is a header, a FlatBuffer graph and a constant region
(`exirc.serialize.xnnpack.header`). The graph is read again with the
charging reader the program's FlatBuffer uses (`size_spans`), so its bytes
are charged to the delegate's nodes, values and constant table; each
constant in the region to the weight it is. Bytes nothing claims are the payload's
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
from exirc.inspector.size_ledger import Fill, Ledger, RowKey
from exirc.inspector.size_spans import Charger, ChargingRecorder
from exirc.serialize import program as P
from exirc.serialize.checked_buffer import TableView
from exirc.serialize.xnnpack import reader as xnnpack_reader
from exirc.serialize.xnnpack.header import XnnpackHeader
from exirc.serialize.xnnpack.reader import ROOT


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

    def payload_rows(self, ledger: Ledger, payload: Payload, group: str) -> PayloadRows | None:
        """The rows of `payload`'s parts, declared now; None when it is not an
        XNNPACK payload that reads."""
        if payload.blob is None:
            return None
        ref = payload.delegate.processed
        return PayloadRows(ledger, payload, group, (ref.location, ref.index))

    def segment_fill(self, ledger: Ledger, index: int, start: int, group: str) -> Fill | None:
        """The fill of delegate payload segment `index`, if XNNPACK's and readable."""
        payload = self.payload(P.DataLocation.SEGMENT, index)
        rows = None if payload is None else self.payload_rows(ledger, payload, group)
        if rows is None:
            return None
        found = rows

        def fill(lo: int, hi: int) -> None:
            charger = Charger(ledger, lo, hi)
            found.charge(charger, start)
            charger.rest(found.padding)
        return fill

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
        return ledger.fill_claims(lambda: [(start, start + used, key)], padding)


class PayloadRows:
    """The rows of one XNNPACK payload's parts, and the charging of its bytes:
    the header, the graph's nodes, values and constant table (each object of
    its FlatBuffer visited again), the weights in its constant region; the
    rest is the payload's padding."""

    def __init__(self, ledger: Ledger, payload: Payload, group: str, where: object) -> None:
        assert payload.blob is not None
        self.payload = payload
        self.size = len(payload.data)
        label = f"{payload.method} delegate[{payload.index}]"

        def row(part: object, item: str, kind: str, **detail: object) -> RowKey:
            return ledger.declare(("payload", where, part), group, f"{label}: {item}", kind,
                                  method=payload.method, delegate=payload.index, **detail)

        self.header = XnnpackHeader.parse(payload.data)  # it read, so this does too
        self.header_row = row("header", "payload header", "delegate_header")
        graph = payload.blob.graph
        self.parts = {
            "nodes": row("nodes", f"XNNPACK nodes ({len(graph.nodes)})", "delegate_graph"),
            "values": row("values", f"XNNPACK values ({len(graph.values)})", "delegate_graph"),
            "constant_data": row("constant_data", "constant data table "
                                 f"({len(graph.constant_data)} entries)", "delegate_graph"),
            "legacy": row("legacy", "constants inside the graph (legacy constant_buffer)",
                          "delegate_weight"),
            "graph": row("graph", "graph root, version, input/output ids", "delegate_graph"),
        }
        self.weights: list[tuple[int, int, RowKey]] = []  # (offset in the region, bytes, row)
        if self.header is not None:
            for weight in payload.weights:
                if weight.named_key is None:
                    key = row(("weight", weight.offset), weight.label, "delegate_weight",
                              type=weight.type, role=weight.role)
                    self.weights.append((weight.offset, weight.nbytes, key))
        self.padding = row("padding", "payload padding (and unknown fields)", "padding")

    def charge(self, charger: Charger, base: int) -> None:
        """Charge the payload's bytes, which start at file offset `base`."""
        data, header = self.payload.data, self.header
        if header is None:  # a bare FlatBuffer (constants inside it, if any)
            fb_start, fb_size = 0, len(data)
        else:
            fb_start, fb_size = header.flatbuffer_offset, header.flatbuffer_size
            charger.charge(base, base + header.length, self.header_row)
        fb_base = base + fb_start
        charger.charge(fb_base, fb_base + 8, self.parts["graph"])  # root offset, identifier
        recorder = ChargingRecorder(data[fb_start:fb_start + fb_size], fb_base, charger,
                                    _GraphRules(self.parts))
        root = recorder.table_at(recorder.follow(0, ROOT), ROOT)
        _walk_graph(root, legacy=header is None)
        if header is not None:
            region = base + header.constant_data_offset
            for offset, nbytes, key in self.weights:
                charger.charge(region + offset, region + offset + nbytes, key)
        charger.charge(base, base + self.size, self.padding)


class _GraphRules:
    """Rows of an XNNPACK graph's objects: its nodes, values, constant table,
    legacy constant bytes, and the rest of the graph."""

    root = ("graph", "root")

    def __init__(self, parts: dict[str, RowKey]) -> None:
        self.parts = parts

    def row(self, state: tuple[str, str]) -> RowKey:
        return self.parts[state[0]]

    def child(self, state: tuple[str, str], part: str, index: int | None) -> tuple[str, str]:
        if state[1] == "root":
            name = part[1:]
            if name == "constant_buffer":
                return ("graph", "legacy_buffer")
            return (_GRAPH_PARTS.get(name, "graph"), "fixed")
        return (state[0], "fixed")

    def vector(self, state: tuple[str, str], name: str, charger: Charger, length: int,
               start: int, end: int) -> None:
        part, kind = state
        if kind == "root":
            part = _GRAPH_PARTS.get(name, "graph")
        charger.charge(length, start, self.parts[part])
        if kind == "legacy_buffer" and name == "storage":
            part = "legacy"  # the bytes; their tables and length prefixes are the graph's
        charger.charge(start, end, self.parts[part])


_GRAPH_PARTS = {"xnodes": "nodes", "xvalues": "values", "constant_data": "constant_data"}


def _walk_graph(t: TableView, *, legacy: bool) -> None:
    """What `deserialize_blob` reads of the graph (the legacy constant_buffer
    only in a payload without a header), in its order, keeping nothing."""
    t.string(0, "version")
    for x in t.tables(1, "xnodes"):
        xnnpack_reader.node(x)
    for x in t.tables(2, "xvalues"):
        xnnpack_reader.value(x)
    t.vector_span(4, 4, "input_ids")
    t.vector_span(5, 4, "output_ids")
    for x in t.tables(8, "constant_data"):
        x.string(2, "named_key")
    if legacy:
        for x in t.tables(6, "constant_buffer"):
            x.vector_span(0, 1, "storage")
