"""Mutations of the data a program carries: delegate payloads, their compile
specs, and the named segments (exirc's symbolic shapes, constant names,
bundled test cases) that readers parse.

Payload bytes are flipped in place, so the program model around them stays
valid and the mutant reaches the backend's or metadata's own parser.
"""

from __future__ import annotations

import json
import random
import zlib
from typing import Any

from exirc.serialize import metadata
from exirc.serialize import program as P
from tools.mutants import picks
from tools.mutants.context import Context, model_kind

_WORDS = [0, 1, 0xFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFF0, 16, 1 << 20]


def flip(data: bytes | memoryview, rng: random.Random) -> tuple[bytes, str]:
    """`data` with a bit flipped, a word overwritten, or its tail cut."""
    out = bytearray(data)
    if not out:
        return bytes(out), "empty"
    action = rng.choice(["bit", "bit", "word", "truncate"])
    position = rng.randrange(len(out))
    if action == "bit":
        out[position] ^= 1 << rng.randrange(8)
        return bytes(out), f"bit flip at {position}"
    if action == "word" and len(out) >= 4:
        position = rng.randrange(len(out) - 3) & ~3
        word = rng.choice(_WORDS)
        out[position:position + 4] = word.to_bytes(4, "little")
        return bytes(out), f"word {word:#x} at {position}"
    return bytes(out[:position]), f"cut to {position} bytes"


def _payloads(program: P.Program) -> list[tuple[str, bytes | memoryview, int, bool]]:
    """(label, data, index, inline) of every delegate payload the program holds."""
    found: list[tuple[str, bytes | memoryview, int, bool]] = []
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            index = delegate.processed.index
            if delegate.processed.location == P.DataLocation.INLINE:
                if 0 <= index < len(program.backend_delegate_data):
                    found.append((delegate.id, program.backend_delegate_data[index].data,
                                  index, True))
            elif 0 <= index < len(program.segments):
                found.append((delegate.id, program.segments[index].data, index, False))
    return found


@model_kind("delegate_payload")
def delegate_payload(ctx: Context) -> str | None:
    """A delegate's payload (an XNNPACK graph) has a bit, a word or its tail changed."""
    payload = picks.choice(ctx.rng, _payloads(ctx.program))
    if payload is None:
        return None
    label, data, index, inline = payload
    new, what = flip(data, ctx.rng)
    if inline:
        ctx.program.backend_delegate_data[index].data = new
    else:
        ctx.program.segments[index].data = new
    return f"{label} payload ({'inline' if inline else 'segment'} {index}): {what}"


@model_kind("delegate_fields")
def delegate_fields(ctx: Context) -> str | None:
    """A delegate names another backend, another payload, or odd compile specs."""
    plan = picks.plan(ctx.program, ctx.rng)
    delegate = picks.choice(ctx.rng, plan.delegates) if plan else None
    if plan is None or delegate is None:
        return None
    action = ctx.rng.choice(["location", "index", "spec", "id"])
    if action == "location":
        delegate.processed.location = P.DataLocation(1 - int(delegate.processed.location))
    elif action == "index":
        delegate.processed.index = ctx.rng.choice([0, 1, 2, 2**32 - 1])
    elif action == "spec" and delegate.compile_specs:
        spec = ctx.rng.choice(delegate.compile_specs)
        spec.value, _ = flip(spec.value, ctx.rng)
    else:
        delegate.id = ctx.rng.choice(["XnnpackBackend", "", "VulkanBackend", "x" * 500])
    return f"{plan.name} delegate {delegate.id[:40]!r}: {action}"


@model_kind("named_data")
def named_data(ctx: Context) -> str | None:
    """A named segment (exirc's metadata, a delegate's weights) is corrupted,
    or its name points at another segment."""
    entry = picks.choice(ctx.rng, ctx.program.named_data)
    if entry is None:
        return None
    if ctx.rng.random() < 0.3 or not 0 <= entry.segment_index < len(ctx.program.segments):
        old = entry.segment_index
        entry.segment_index = ctx.rng.choice([0, old + 1, len(ctx.program.segments), 2**32 - 1])
        return f"named_data {entry.key!r}: segment {old} -> {entry.segment_index}"
    segment = ctx.program.segments[entry.segment_index]
    segment.data, what = flip(segment.data, ctx.rng)
    return f"named_data {entry.key!r} (segment {entry.segment_index}): {what}"


_EXPRESSIONS = ["s0*s0*s0*s0*s0*s0", "2**64", "s0//0", "-s0", "s_unknown", "(", "s0-100",
                "9223372036854775807*2", "0", "", "s0 if s0 else s0", "__import__('os')"]


@model_kind("metadata_json")
def metadata_json(ctx: Context) -> str | None:
    """A value inside exirc's JSON metadata (the `exirc.metadata` segment's
    symbolic shapes and their bounds, names, module paths; bundled test
    cases) becomes another: an edge number, an
    expression, a shorter list, a missing key. The JSON stays well-formed
    and, padded with spaces, as long as it was, so what follows it holds."""
    entries = [e for e in ctx.program.named_data if e.key.startswith("exirc.")
               and 0 <= e.segment_index < len(ctx.program.segments)]
    entry = picks.choice(ctx.rng, entries)
    if entry is None:
        return None
    segment = ctx.program.segments[entry.segment_index]
    data = bytes(segment.data)
    if data[:1] != b"{" and not data.startswith(b"EXIRCBIO"):  # bundled cases: JSON inside
        return _bend_compressed(ctx, entry.key, segment, data)
    start = data.find(b"{")
    if start < 0:
        return None
    try:
        document, end = json.JSONDecoder().raw_decode(data[start:].decode("utf-8", "replace"))
    except ValueError:
        return None
    what = _bend_json(document, ctx.rng)
    text = json.dumps(document, separators=(",", ":")).encode()
    if what is None or len(text) > end:  # longer would overwrite what follows
        return None
    segment.data = data[:start] + text.ljust(end) + data[start + end:]
    return f"named_data {entry.key!r}: {what}"


def _bend_compressed(ctx: Context, key: str, segment: Any, data: bytes) -> str | None:
    """The same for a zlib-compressed segment (exirc.serialize.json_segment):
    bent, then compressed again; the segment is its own, so its length may change."""
    merged = key == metadata.NAMED_DATA_KEY  # raw deflate, with a preset dictionary
    try:
        document = json.loads(metadata.decompress(data) if merged else zlib.decompress(data))
    except (zlib.error, ValueError):
        return None
    # exirc.metadata's stack traces are written from the chains (the reader
    # put them there), so bending them here would change nothing: one of the
    # other members is bent.
    traces = document.pop("stack_traces", None) if isinstance(document, dict) else None
    what = _bend_json(document, ctx.rng)
    if traces is not None:
        document["stack_traces"] = traces
    if what is None:
        return None
    text = json.dumps(document, separators=(",", ":")).encode()
    if merged:
        if not isinstance(document, dict):
            return None
        segment.data = metadata.compress(document)
    else:
        segment.data = zlib.compress(text)
    return f"named_data {key!r}: {what}"


def _bend_json(document: Any, rng: random.Random) -> str | None:
    """Change one leaf (or container) somewhere in `document`, in place."""
    path: list[str] = []
    node = document
    while True:
        children = list(node.items()) if isinstance(node, dict) else \
            list(enumerate(node)) if isinstance(node, list) else []
        if not children:
            return None
        key, child = rng.choice(children)
        if isinstance(child, (dict, list)) and child and rng.random() < 0.8:
            path.append(str(key))
            node = child
            continue
        where = "/".join(path + [str(key)])
        if isinstance(child, bool) or child is None:
            new: Any = rng.choice([0, "x", None, True])
        elif isinstance(child, int):
            new = rng.choice(picks.EDGE_INTS + [child + 1, -child])
        elif isinstance(child, float):
            new = rng.choice([-1.0, 1e308, 0.0])
        elif isinstance(child, str):
            new = rng.choice(_EXPRESSIONS)
        elif isinstance(child, list):
            new = child[:-1] if child and rng.random() < 0.5 else child + child[:1]
        else:
            new = {}
        if isinstance(node, dict) and rng.random() < 0.15:
            del node[key]
            return f"{where} removed"
        node[key] = new
        return f"{where}: {str(child)[:40]} -> {str(new)[:40]}"


_EDGE_ELEMENTS = [-1, 0, 2**31 - 1, -(2**31), 2**62, 255, 128, 10**9]


@model_kind("constant_data")
def constant_data(ctx: Context) -> str | None:
    """Some elements of a constant tensor (an index, a zero point, a weight;
    integer ones preferred) become edge values: what a kernel reads as data."""
    plan = picks.plan(ctx.program, ctx.rng)
    tensors = picks.tensors(plan, constant=True) if plan else []
    integer = [i for i in tensors if plan and not _floating(plan.values[i])]
    index = picks.choice(ctx.rng, integer if integer and ctx.rng.random() < 0.7 else tensors)
    segment = ctx.program.constant_segment
    if plan is None or index is None or segment is None or \
            not 0 <= segment.segment_index < len(ctx.program.segments):
        return None
    tensor = plan.values[index]
    assert isinstance(tensor, P.Tensor)
    holder = ctx.program.segments[segment.segment_index]
    if not 0 < tensor.data_buffer_idx < len(segment.offsets):
        return None
    start, end = P.constant_span(segment.offsets, tensor.data_buffer_idx, len(holder.data))
    size = tensor.scalar_type.itemsize if isinstance(tensor.scalar_type, P.ScalarType) else 1
    if end - start < size:
        return None
    data = bytearray(holder.data)
    written = []
    for _ in range(ctx.rng.choice([1, 1, 4])):
        at = start + ctx.rng.randrange((end - start) // size) * size
        value = ctx.rng.choice(_EDGE_ELEMENTS)
        data[at:at + size] = (value % (1 << (8 * size))).to_bytes(size, "little")
        written.append(f"{value} at byte {at - start}")
    holder.data = bytes(data)
    return f"{plan.name} %{index} (constant {tensor.data_buffer_idx}): {', '.join(written)}"


def _floating(value: P.EValue) -> bool:
    return isinstance(value, P.Tensor) and isinstance(value.scalar_type, P.ScalarType) \
        and value.scalar_type.name in ("FLOAT", "DOUBLE", "HALF", "BFLOAT16")
