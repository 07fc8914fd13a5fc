"""What is inside a delegate's payload, as plain data.

A payload is opaque to the program: only its backend knows the format.
exirc knows one, XNNPACK's (`exirc.serialize.xnnpack`), so for an
`XnnpackBackend` delegate the inspector reads the graph and reports its
nodes, values and weights; for any other backend only what the program says
(size, compile specs). A payload that does not read is a fact about the
file, not a failure of inspect: it is reported with the reader's message
and the rest of the file is inspected as usual. The reader promises a
`FormatError` for any bad bytes (a fuzz test holds it to that), so nothing
else is caught: another exception is a bug to see.

ExecuTorch keeps an XNNPACK graph's weights outside the payload, in the
program's named data (keyed by the sha256 of their bytes), so that
delegates sharing a weight store it once; older payloads carry them in
their own constant region. Both count as the delegate's weights.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from exirc.errors import FormatError
from exirc.serialize import program as P
from exirc.serialize.xnnpack import graph as G
from exirc.serialize.xnnpack.header import XnnpackHeader
from exirc.serialize.xnnpack.reader import deserialize_blob

XNNPACK_BACKEND = "XnnpackBackend"


@dataclass(frozen=True, eq=False)  # eq=False: one payload is one delegate, however alike
class Payload:
    """One delegate's processed bytes, and what reading them gave."""

    method: str
    index: int  # in the method's delegate list
    delegate: P.BackendDelegate
    data: memoryview
    blob: G.XnnpackBlob | None = None  # an XNNPACK payload that reads
    error: str | None = None  # why an XNNPACK payload does not read
    plan: int = 0  # the method's index in the program
    # Weights by blob, shared by the payloads of one program: delegates that
    # point at the same bytes share one blob, read once.
    known: dict[int, _Weights] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def label(self) -> str:
        return f"{self.method} delegate[{self.index}] {self.delegate.id}"

    # Cached: the summary and the size report ask per segment, and a big
    # model has hundreds of weight segments.
    @property
    def weights(self) -> list[Weight]:
        return self._weights().all

    @property
    def named_weights(self) -> dict[str, Weight]:
        return self._weights().named

    def _weights(self) -> _Weights:
        if self.blob is None:
            return _NO_WEIGHTS
        found = self.known.get(id(self.blob))
        if found is None:
            weights = graph_weights(self.blob)
            found = self.known[id(self.blob)] = _Weights(
                weights, {w.named_key: w for w in weights if w.named_key})
        return found


@dataclass(frozen=True)
class _Weights:
    """The weights of one blob, computed once however many delegates use it."""

    all: list[Weight]
    named: dict[str, Weight]


def payload_data(program: P.Program, delegate: P.BackendDelegate) -> memoryview:
    ref = delegate.processed
    if ref.location == P.DataLocation.INLINE:
        return memoryview(program.backend_delegate_data[ref.index].data)
    return memoryview(program.segments[ref.index].data)


_NO_WEIGHTS = _Weights([], {})


class _Reads:
    """What reading each payload gave, by where it is: a file may point any
    number of delegates at one payload, which is read once."""

    def __init__(self) -> None:
        self.found: dict[tuple[P.DataLocation, int], tuple[G.XnnpackBlob | None, str | None]] = {}
        self.weights: dict[int, _Weights] = {}

    def read(self, delegate: P.BackendDelegate, data: memoryview
             ) -> tuple[G.XnnpackBlob | None, str | None]:
        if delegate.id != XNNPACK_BACKEND:
            return None, None
        key = (delegate.processed.location, delegate.processed.index)
        if key not in self.found:
            try:
                self.found[key] = deserialize_blob(data), None
            except FormatError as failure:
                self.found[key] = None, str(failure)
        return self.found[key]


def plan_payloads(program: P.Program, plan: P.ExecutionPlan, plan_index: int = 0,
                  reads: _Reads | None = None) -> list[Payload]:
    reads = reads or _Reads()
    payloads = []
    for index, delegate in enumerate(plan.delegates):
        data = payload_data(program, delegate)
        blob, error = reads.read(delegate, data)
        payloads.append(Payload(plan.name, index, delegate, data, blob, error, plan_index,
                                reads.weights))
    return payloads


def program_payloads(program: P.Program) -> list[Payload]:
    reads = _Reads()
    return [p for i, plan in enumerate(program.execution_plan)
            for p in plan_payloads(program, plan, i, reads)]


# --------------------------------------------------------------------------
# The weights of an XNNPACK graph.
# --------------------------------------------------------------------------


@dataclass
class Weight:
    """A constant an XNNPACK graph reads, once however many values read it."""

    nbytes: int
    named_key: str | None  # None: in the payload's own constant region
    offset: int  # in the constant region (unused for named data)
    type: str  # of the first value reading it, e.g. `fp32[8, 3, 3, 3]`
    role: str  # what reads it, e.g. `conv2d filter`
    values: int = 1  # how many values read it

    @property
    def label(self) -> str:
        """`weight a2fd2af9...: fp32[8, 3, 3, 3] conv2d filter`."""
        if self.named_key is None:
            where = f"at {self.offset}"
        else:  # sha256 keys are long: a prefix tells them apart
            key = self.named_key
            where = repr(key) if len(key) <= 16 else key[:8] + "..."
        more = f" (+{self.values - 1} more values)" if self.values > 1 else ""
        return f"weight {where}: {self.type} {self.role}{more}"


def xnn_type(value: G.TensorValue) -> str:
    return f"{value.datatype.name.lower()}[{', '.join(map(str, value.dims))}]"


def value_roles(graph: G.XNNGraph) -> dict[int, str]:
    """Value id -> the first node reading it, and as what (`conv2d filter`)."""
    roles: dict[int, str] = {}
    for node in graph.nodes:
        for f in dataclasses.fields(node.params):
            if f.name.endswith("_id") and not f.name.startswith("output"):
                ident = getattr(node.params, f.name)
                roles.setdefault(ident, f"{node.kind.name.lower()} {f.name[:-3]}")
    return roles


def graph_weights(blob: G.XnnpackBlob) -> list[Weight]:
    """The distinct constants the graph's values read (quantization scales too),
    in value order; entries naming the same bytes count once."""
    graph = blob.graph
    roles = value_roles(graph)
    found: dict[tuple[Any, ...], Weight] = {}

    def add(entry_index: int, type_: str, role: str) -> None:
        if not 0 < entry_index < len(graph.constant_data):
            return  # 0 is "not a constant"; the reader refuses the rest
        entry = graph.constant_data[entry_index]
        key = ("named", entry.named_key) if entry.is_named else \
            ("region", entry.offset, entry.size)
        if key in found:
            found[key].values += 1
        else:
            found[key] = Weight(entry.size, entry.named_key or None, entry.offset, type_, role)

    for value in graph.values:
        role = roles.get(value.id_out, "(read by no node)")
        if value.constant_buffer_idx:
            add(value.constant_buffer_idx, xnn_type(value), role)
        quant = value.quant
        if isinstance(quant, (G.PerChannelQuant, G.PerChannelGroupQuant)) and \
                quant.scale_buffer_idx:
            add(quant.scale_buffer_idx, f"{quant.num_scales} scales", f"of {role}")
    return list(found.values())


# --------------------------------------------------------------------------
# The facts `exirc inspect` reports.
# --------------------------------------------------------------------------


def named_key_users(payloads: Iterable[Payload]) -> Counter[str]:
    """Named-data key -> how many delegates read it (each blob's keys counted
    once, times the delegates sharing the blob)."""
    sharing: dict[int, tuple[Payload, int]] = {}  # id(blob) -> (a payload, how many)
    for payload in payloads:
        if payload.blob is not None:
            first, count = sharing.get(id(payload.blob), (payload, 0))
            sharing[id(payload.blob)] = (first, count + 1)
    users: Counter[str] = Counter()
    for payload, count in sharing.values():
        for key in payload.named_weights:
            users[key] += count
    return users


def describe_delegate(program: P.Program, payload: Payload,
                      key_users: Mapping[str, int] | None = None) -> dict[str, Any]:
    """A delegate's entry in `exirc inspect --json`. An XNNPACK delegate's also
    has `xnnpack` (the graph's facts, or null when the payload does not read)
    and `payload_error` (why not, or null); other backends' payloads are
    opaque, so their entries have neither."""
    delegate = payload.delegate
    entry: dict[str, Any] = {
        "index": payload.index,
        "id": delegate.id,
        "location": delegate.processed.location.name.lower(),
        "data_index": delegate.processed.index,
        "bytes": len(payload.data),
        "compile_specs": [s.key for s in delegate.compile_specs],
    }
    if delegate.id == XNNPACK_BACKEND:
        entry["xnnpack"] = None if payload.blob is None else \
            xnnpack_facts(payload, {n.key for n in program.named_data}, key_users or {})
        entry["payload_error"] = payload.error
    return entry


def xnnpack_facts(payload: Payload, named_keys: set[str],
                  key_users: Mapping[str, int]) -> dict[str, Any]:
    assert payload.blob is not None
    graph = payload.blob.graph
    inputs = sum(1 for v in graph.values if v.flags & G.FLAG_EXTERNAL_INPUT)
    outputs = sum(1 for v in graph.values if v.flags & G.FLAG_EXTERNAL_OUTPUT)
    constants = sum(1 for v in graph.values if v.constant_buffer_idx)
    internal = sum(1 for v in graph.values if not v.constant_buffer_idx and
                   not v.flags & (G.FLAG_EXTERNAL_INPUT | G.FLAG_EXTERNAL_OUTPUT))
    weights = payload.weights
    named = list(payload.named_weights.values())
    header = XnnpackHeader.parse(payload.data)  # it read, so this does too
    return {
        "version": graph.version,
        "nodes": len(graph.nodes),
        "node_kinds": dict(sorted(Counter(n.kind.name.lower() for n in graph.nodes).items())),
        "fused_activations": sum(1 for n in graph.nodes if n.output_min_max is not None),
        "values": {"count": len(graph.values), "inputs": inputs, "outputs": outputs,
                   "constants": constants, "internal": internal},
        "datatypes": dict(sorted(Counter(v.datatype.name.lower()
                                         for v in graph.values).items())),
        "weights": {
            "count": len(weights),
            "bytes": sum(w.nbytes for w in weights),
            "named_data_bytes": sum(w.nbytes for w in named),
            "payload_bytes": sum(w.nbytes for w in weights if not w.named_key),
            # Bytes this delegate reads that other delegates read too (stored once).
            "shared_bytes": sum(w.nbytes for w in named
                                if key_users.get(w.named_key or "", 0) > 1),
            "missing_named_keys": sorted(w.named_key for w in named
                                         if w.named_key not in named_keys),
        },
        "layout": {
            "header_bytes": header.length if header else 0,
            "flatbuffer_bytes": header.flatbuffer_size if header else len(payload.data),
            "constant_region_bytes": header.constant_data_size if header else 0,
        },
    }


def counts_text(counts: Mapping[str, int]) -> str:
    """`conv2d ×3, fully_connected, static_transpose ×2`: names in order, a count past one."""
    return ", ".join(name if n == 1 else f"{name} ×{n}" for name, n in counts.items())


def call_note(payload: Payload) -> str | None:
    """What a DelegateCall line adds about its payload, if anything is known."""
    if payload.error is not None:
        return "unreadable XNNPACK payload"
    if payload.blob is not None:
        count = len(payload.blob.graph.nodes)
        return f"{count} XNNPACK node" + ("" if count == 1 else "s")
    return None


# Delegates listed as readers of one weight segment; more are counted only
# (a file can point a hundred thousand delegates at one payload).
MAX_READERS = 64


@dataclass
class Readers:
    """The delegates whose graphs read one named-data segment: the first
    `MAX_READERS` in plan order, and how many in all."""

    first: list[Payload] = dataclasses.field(default_factory=list)
    count: int = 0


def weight_segments(program: P.Program, payloads: Iterable[Payload]) -> dict[int, Readers]:
    """Named-data segment index -> the delegates whose graphs read it."""
    segment_of: dict[str, int] = {}
    for named in program.named_data:
        segment_of.setdefault(named.key, named.segment_index)
    readers: dict[int, Readers] = {}
    segments_of: dict[int, list[int]] = {}  # id(blob) -> the segments it reads
    listed: Counter[int] = Counter()  # id(blob) -> its payloads listed so far
    for payload in payloads:
        if payload.blob is None:
            continue
        blob = id(payload.blob)
        segments = segments_of.get(blob)
        if segments is None:
            found = (segment_of.get(key) for key in payload.named_weights)
            segments = segments_of[blob] = list(dict.fromkeys(
                s for s in found if s is not None))
        for segment in segments if listed[blob] < MAX_READERS else ():
            entry = readers.setdefault(segment, Readers())
            if len(entry.first) < MAX_READERS:
                entry.first.append(payload)
        listed[blob] += 1
    for blob, segments in segments_of.items():  # every delegate counts, listed or not
        for segment in segments:
            readers[segment].count += listed[blob]
    return readers
