"""The inspector's text views, rendered from `describe()` data.

The default view is meant to fit one screen: long tables are cut with a
"... N more" line and `--json` has everything.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from exirc.inspector.delegates import counts_text, plan_payloads
from exirc.inspector.external_data import external_data_line
from exirc.inspector.kernels import kernels_line
from exirc.inspector.listing import listing_lines
from exirc.inspector.quantization import call_notes, scheme_counts
from exirc.serialize.module_paths import stored_module_paths
from exirc.serialize.program import ExecutionPlan, Program
from exirc.serialize.symbolic_shapes import MethodShapes

_MAX_ROWS = 12
# Inputs, outputs or readers named on one line before the rest are counted.
_MAX_IO = 8
# Lines of delegate details a method shows before the rest are cut.
_MAX_DELEGATE_LINES = 16

Style = Callable[[str], str]


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def compact_bytes(n: int) -> str:
    """`96 B`, or `1.5 KiB (1,536 B)` once the human form rounds."""
    return human_bytes(n) if n < 1024 else f"{human_bytes(n)} ({n:,} B)"


def clean(text: str) -> str:
    """Names come from the file: escape control characters so a crafted name
    cannot forge lines of the report."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _cut(rows: Iterable[str], count: int, indent: str) -> Iterator[str]:
    """The first rows of `count` (made only as far as shown), then how many more."""
    if count <= _MAX_ROWS:
        yield from rows
        return
    yield from itertools.islice(rows, _MAX_ROWS - 1)
    yield f"{indent}... {count - _MAX_ROWS + 1} more (see --json)"


def _io(entries: Sequence[dict[str, Any]]) -> str:
    shown = [f"{_io_name(e, i)}%{e['value']} {e['type']}"
             for i, e in enumerate(itertools.islice(entries, _MAX_IO))]
    if len(entries) > _MAX_IO:
        shown.append(f"... {len(entries) - _MAX_IO} more")
    return ", ".join(shown) or "none"


def _io_name(entry: dict[str, Any], position: int) -> str:
    """`input_ids=` for a stored name; nothing for the default `input_N`/`output_N`."""
    name = entry.get("name")
    if not name or name in (f"input_{position}", f"output_{position}"):
        return ""
    return f"{clean(name)}="


def render_summary(info: dict[str, Any], bold: Style) -> str:
    return "\n".join(summary_lines(info, bold))


def summary_lines(info: dict[str, Any], bold: Style) -> Iterator[str]:
    """The summary view, a line at a time (a method at a time)."""
    f = info["file"]
    name = clean(f["path"] or "<bytes>")
    yield bold(f"{name}: program file (ET12, schema v{f['schema_version']}), "
               f"{human_bytes(f['size'])}")
    header = f["header"]
    if header:
        yield (f"  header: program {human_bytes(header['program_size'])}, "
               f"segments at offset {header['segment_base_offset']} "
               f"({human_bytes(header['segment_data_size'])})")
    else:
        yield "  header: none (no extended header; no segments)"
    yield from _cut((f"  segment {s['index']}: {human_bytes(s['size'])} at offset "
                     f"{s['offset']} ({clean(s['role'])}{_weights_of(s)})"
                     for s in f["segments"]), len(f["segments"]), "  ")
    for method in info["methods"]:
        yield ""
        yield from _render_method(method, bold)
    c = info["constants"]
    yield ""
    if "kernels" in info:
        yield bold("kernels: ") + clean(kernels_line(info["kernels"]))
    yield bold("constants: ") + f"{plural(c['count'], 'tensor')}, {human_bytes(c['bytes'])}"
    if info.get("external_data"):
        yield bold("external data: ") + clean(external_data_line(info["external_data"]))
    size = info["size"]
    total = max(size["total"], 1)
    parts = [f"{key.replace('_', ' ')} {human_bytes(size[key])} ({100 * size[key] / total:.0f}%)"
             for key in ("program", "constants", "delegate_data", "other_segments", "padding")
             if size[key] or key in ("program", "constants")]
    yield bold("size: ") + " | ".join(parts)
    quantized = info.get("quantization", {}).get("tensors", [])
    if quantized:  # a float program's summary stays as it was
        schemes = counts_text({k.replace("_", "-"): n
                               for k, n in scheme_counts(quantized).items()})
        yield (bold("quantization: ") + f"{plural(len(quantized), 'quantized tensor')} "
               f"({schemes}; see --show quantization)")
    if info.get("bundled_cases"):
        yield (bold("bundled test cases: ") + ", ".join(
            f"{clean(m)} {n}" for m, n in info["bundled_cases"].items())
            + " (run them with `exirc run --check`)")


_MAX_CONSTANT = 200  # characters of a constant method's value shown


def _render_method(m: dict[str, Any], bold: Style) -> Iterator[str]:
    if m.get("constant") is not None:
        value = repr(m["constant"])
        value = value if len(value) <= _MAX_CONSTANT else value[:_MAX_CONSTANT] + "..."
        yield bold(f"method {clean(m['name'])}: ") + f"constant {clean(value)}"
        return
    yield (bold(f"method {clean(m['name'])}: ") +
           f"{plural(m['instruction_count'], 'instruction')} in "
           f"{plural(m['chains'], 'chain')}, {plural(m['kernel_calls'], 'kernel call')}, "
           f"{plural(m['values']['count'], 'value')}")
    yield f"  inputs:  {_io(m['inputs'])}"
    yield f"  outputs: {_io(m['outputs'])}"
    count = len(m["operators"])
    if count:
        # Most called first; only the rows shown are sorted out of the rest.
        shown = _MAX_ROWS if count <= _MAX_ROWS else _MAX_ROWS - 1
        ops = heapq.nsmallest(shown, m["operators"], key=lambda o: (-o["calls"], o["name"]))
        width = max(len(_qualified(o)) for o in ops)
        yield f"  operators ({count}):"
        yield from _cut((f"    {_qualified(o):<{width}}  {plural(o['calls'], 'call'):>10}"
                         for o in ops), count, "    ")
    plan = m["memory_plan"]
    buffers = plan["buffers"]
    yield (f"  memory plan: {plural(len(buffers), 'buffer')}, "
           f"{human_bytes(plan['total_bytes'])}, "
           f"{plural(plan['planned_tensors'], 'planned tensor')}")
    yield from _cut((f"    buffer {b['id']}: {b['bytes']} B" for b in buffers), len(buffers),
                    "    ")
    if m["state"]:
        total = sum(s["bytes"] for s in m["state"])
        yield (f"  state: {plural(len(m['state']), 'tensor')}, {human_bytes(total)}, "
               "kept from run to run")
        yield from _cut((f"    {clean(s['name'] or '%' + str(s['value']))}: {s['type']}, "
                         f"{s['bytes']} B in buffer {s['buffer']} at {s['offset']}"
                         f"{'' if s['initial_value'] else ' (no initial value: zeros)'}"
                         for s in m["state"]), len(m["state"]), "    ")
    if m["delegates"]:
        yield f"  delegates ({len(m['delegates'])}):"
        shown = 0
        for d in m["delegates"]:
            block = _render_delegate(d)
            if shown and shown + len(block) > _MAX_DELEGATE_LINES:
                yield f"    ... {len(m['delegates']) - d['index']} more (see --json)"
                break
            yield from block
            shown += len(block)
    else:
        yield "  delegates: none"


def _weights_of(segment: dict[str, Any]) -> str:
    readers = segment.get("weights_of") or []
    if not readers:
        return ""
    shown = [f"{clean(r['method'])} delegate[{r['delegate']}]" for r in readers[:_MAX_IO]]
    count = segment.get("weights_of_count", len(readers))
    if count > len(shown):
        shown.append(f"{count - len(shown)} more")
    return ": weights of " + ", ".join(shown)


def _render_delegate(d: dict[str, Any]) -> list[str]:
    """A delegate's lines: its payload, and for XNNPACK what the graph holds."""
    head = (f"    [{d['index']}] {clean(d['id'])}: {human_bytes(d['bytes'])} "
            f"({d['location']} {d['data_index']})")
    if d["compile_specs"]:
        head += ", compile specs: " + ", ".join(clean(k) for k in d["compile_specs"])
    lines = [head]
    if d.get("payload_error") is not None:
        lines.append(f"        unreadable XNNPACK payload: {clean(d['payload_error'])}")
    x = d.get("xnnpack")
    if x is None:
        return lines
    fused = x["fused_activations"]
    lines.append(f"        {plural(x['nodes'], 'XNNPACK node')}: {counts_text(x['node_kinds'])}"
                 + (f" ({fused} with a fused activation)" if fused else ""))
    v = x["values"]
    parts = [plural(v["inputs"], "input"), plural(v["outputs"], "output"),
             plural(v["constants"], "constant"), f"{v['internal']} internal"]
    lines.append(f"        {plural(v['count'], 'value')}: {', '.join(parts)}; datatypes: "
                 f"{counts_text(x['datatypes'])}")
    lines.append(f"        weights: {_weights_text(x['weights'])}")
    return lines


def _weights_text(w: dict[str, Any]) -> str:
    if not w["count"]:
        return "none"
    named, inside = w["named_data_bytes"], w["payload_bytes"]
    if named and inside:
        where = f"{compact_bytes(named)} in named data, {compact_bytes(inside)} in the payload"
    else:
        where = "in named data" if named else "in the payload"
    text = f"{plural(w['count'], 'tensor')}, {compact_bytes(w['bytes'])} {where}"
    if w["shared_bytes"]:
        text += f" ({compact_bytes(w['shared_bytes'])} shared with other delegates)"
    if w["missing_named_keys"]:
        text += (f"; {plural(len(w['missing_named_keys']), 'named key')} missing from the "
                 "program's named data")
    return text


def _qualified(op: dict[str, Any]) -> str:
    name = f"{op['name']}.{op['overload']}" if op["overload"] else op["name"]
    return clean(name)


def render_instructions(plans: list[ExecutionPlan], bold: Style,
                        shapes: Mapping[str, MethodShapes] | None = None,
                        program: Program | None = None) -> str:
    """The listing of each plan; `shapes` (by method) name dynamic dims by symbol;
    with the `program` the plans are from, delegate calls say what their payloads hold."""
    return "\n".join(instruction_lines(plans, bold, shapes, program))


def instruction_lines(plans: list[ExecutionPlan], bold: Style,
                      shapes: Mapping[str, MethodShapes] | None = None,
                      program: Program | None = None) -> Iterator[str]:
    """`render_instructions`, a line at a time."""
    stored = stored_module_paths(program) if program is not None else None
    for i, plan in enumerate(plans):
        if i:
            yield ""
        yield bold(f"method {clean(plan.name)}:")
        method_shapes = shapes.get(plan.name) if shapes else None
        payloads = plan_payloads(program, plan) if program is not None else []
        # Quantized calls whose scales are tensors say what the tensors hold.
        notes = call_notes(program, plan) if program is not None else None
        modules = stored.of_plan(plan) if stored is not None else None
        yield from (clean(line) for line in listing_lines(plan, method_shapes, payloads, notes,
                                                          modules))
