"""What is inside a program file, as plain JSON-able data.

`describe(program_file)` is the single source of the inspector's facts: the
text views render it and `exirc inspect --json` prints it. Its shape is
versioned by `FORMAT_VERSION`; docs/format.md documents it. Add keys freely;
renaming or removing one is a new version.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from exirc.inspector.delegates import (
    Payload,
    describe_delegate,
    named_key_users,
    payload_data,
    plan_payloads,
    program_payloads,
    weight_segments,
)
from exirc.inspector.external_data import external_data_facts
from exirc.inspector.kernels import kernel_needs
from exirc.inspector.lazy_json import SLOT, Lazy, Template
from exirc.inspector.listing import ListingContext, instruction_text, source_of, value_type
from exirc.inspector.quantization import quantization_facts
from exirc.serialize import ProgramFile, io_names, symbolic_shapes
from exirc.serialize import program as P
from exirc.serialize.bundled_cases import read_bundle
from exirc.serialize.data_file import DataFile
from exirc.serialize.module_paths import ModulePaths, stored_module_paths
from exirc.serialize.symbolic_shapes import MethodShapes
from exirc.serialize.validate import external

FORMAT_NAME = "exirc.inspect"
FORMAT_VERSION = 1

# An entry of a method's `memory_plan.buffers`: a plan can list a hundred
# thousand, so each is filled into a template rather than walked as a dict.
_BUFFER = Template({"id": SLOT, "bytes": SLOT})


def describe(pf: ProgramFile, *, path: str | None = None,
             data: tuple[DataFile, str, int] | None = None) -> dict[str, Any]:
    """What `inspect --json` prints; `data` is the external data file given
    (its contents, path and size), checked against the program."""
    program = pf.program
    roles = segment_roles(program)
    shapes = symbolic_shapes.stored_symbolic_shapes(program)
    names = io_names.stored_io_names(program)
    modules = stored_module_paths(program)
    payloads = program_payloads(program)
    readers = weight_segments(program, payloads)
    key_users = named_key_users(payloads)
    by_method: dict[int, list[Payload]] = {}  # plan index -> its delegates' payloads
    for payload in payloads:
        by_method.setdefault(payload.plan, []).append(payload)
    size = size_breakdown(pf, roles, set(readers))
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "file": {
            "path": path,
            "size": pf.file_size,
            "identifier": "ET12",
            "schema_version": program.version,
            "header": None if pf.header is None else {
                "length": pf.header.length,
                "program_size": pf.header.program_size,
                "segment_base_offset": pf.header.segment_base_offset,
                "segment_data_size": pf.header.segment_data_size,
            },
            "segments": Lazy(len(pf.segment_spans), lambda: (
                {"index": i, "offset": start, "size": size, "role": roles.get(i, "unused"),
                 # Named data a delegate's payload reads: the delegate's weights
                 # (the first MAX_READERS delegates; weights_of_count says how many).
                 "weights_of": [{"method": p.method, "delegate": p.index}
                                for p in (readers[i].first if i in readers else [])],
                 "weights_of_count": readers[i].count if i in readers else 0}
                for i, (start, size) in enumerate(pf.segment_spans))),
        },
        "size": size,
        "constants": constants_summary(program, size["constants"]),
        "methods": Lazy(len(program.execution_plan), lambda: (
            describe_plan(program, plan, shapes.get(plan.name), by_method.get(i, []), key_users,
                          names, modules)
            for i, plan in enumerate(program.execution_plan))),
        "bundled_cases": bundled_cases(program),
        "quantization": quantization_facts(program, payloads),
        # The kernel libraries the runtime must link, and the backends it must have.
        "kernels": kernel_needs(program),
        # Tensors and delegate weights in an external data file (null: none).
        "external_data": external_data_facts(program, key_users, data),
    }


def bundled_cases(program: P.Program) -> dict[str, int]:
    """Test cases `exirc compile --bundle` stored, per method (none in other files)."""
    bundle = read_bundle(program)
    return bundle.counts() if bundle is not None else {}


def segment_roles(program: P.Program) -> dict[int, str]:
    roles: dict[int, str] = {}
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            if delegate.processed.location == P.DataLocation.SEGMENT:
                roles[delegate.processed.index] = f"delegate:{delegate.id}"
    for sub in program.mutable_data_segments:
        roles[sub.segment_index] = "mutable_data"
    for named in program.named_data:
        roles[named.segment_index] = "named_data"
    if program.constant_segment is not None and program.constant_segment.offsets:
        roles[program.constant_segment.segment_index] = "constants"
    return roles


def size_breakdown(pf: ProgramFile, roles: dict[int, str],
                   delegate_weights: Collection[int] = ()) -> dict[str, int]:
    """Every byte of the file in exactly one bucket. Named data that delegates
    read (`delegate_weights`, segment indices) is delegate data: the payload
    keeps its weights there so that delegates sharing one store it once."""
    program = pf.program
    inline_constants = sum(len(b.storage) for b in program.constant_buffer)
    inline_delegate = sum(len(d.data) for d in program.backend_delegate_data)
    buckets = {
        "program": pf.program_size - inline_constants - inline_delegate,
        "constants": inline_constants,
        "delegate_data": inline_delegate,
        "other_segments": 0,
    }
    for i, (_, size) in enumerate(pf.segment_spans):
        role = roles.get(i, "unused")
        if role == "constants":
            buckets["constants"] += size
        elif role.startswith("delegate:") or (role == "named_data" and i in delegate_weights):
            buckets["delegate_data"] += size
        else:
            buckets["other_segments"] += size
    # Segments may overlap in a hostile file; never report negative padding.
    buckets["padding"] = max(0, pf.file_size - sum(buckets.values()))
    buckets["total"] = pf.file_size
    return buckets


def constants_summary(program: P.Program, stored_bytes: int) -> dict[str, int]:
    """The constant tensors referenced, and `stored_bytes`: what the constants take
    in the file, the one figure the size line and the segment line show too (the
    constant segment with the alignment between its buffers, and inline buffers).

    Program state is not counted: a planned tensor with data is state, its
    initial value stored in a mutable data segment whose buffers have numbers
    of their own (not the constants')."""
    used: set[int] = set()
    for plan in program.execution_plan:
        for value in plan.values:
            if isinstance(value, P.Tensor) and value.data_buffer_idx \
                    and value.allocation_info is None and not external(value):
                used.add(value.data_buffer_idx)
    return {
        "count": len(used),
        "bytes": stored_bytes,
        "buffers": max(0, program.constant_count() - 1),  # entry 0 is reserved
    }


def describe_plan(program: P.Program, plan: P.ExecutionPlan,
                  shapes: MethodShapes | None = None, payloads: list[Payload] | None = None,
                  key_users: Mapping[str, int] | None = None,
                  stored_names: Mapping[str, io_names.MethodNames] | None = None,
                  stored_modules: ModulePaths | None = None) -> dict[str, Any]:
    """One method; `payloads` are its delegates' (read here if not given),
    `key_users` how many delegates of the program read each named weight,
    `stored_names` the program's input and output names (`input_0`... without),
    `stored_modules` the submodule each instruction came from (none without).
    Its long lists (instructions, operators, buffers...) are `Lazy`."""
    if payloads is None:
        payloads = plan_payloads(program, plan)
    calls: Counter[int] = Counter()
    instruction_count = 0
    for chain in plan.chains:
        instruction_count += len(chain.instructions)
        for instr in chain.instructions:
            if isinstance(instr, P.KernelCall):
                calls[instr.op_index] += 1
    context = ListingContext.of(plan, shapes, payloads)
    names = io_names.method_names(stored_names or {}, plan.name, len(plan.inputs),
                                  len(plan.outputs))
    modules = stored_modules.of_plan(plan) if stored_modules is not None else None
    value_kinds = Counter(type(v).__name__ for v in plan.values)
    sizes = plan.non_const_buffer_sizes
    buffers = len(sizes) - (1 if sizes and not sizes[0] else 0)  # entry 0 when it has bytes
    state_count = sum(1 for _ in _state_values(plan))
    return {
        "name": plan.name,
        "inputs": Lazy(len(plan.inputs), lambda: (
            io_entry(plan, index, shapes, names.input(i)) for i, index in enumerate(plan.inputs))),
        "outputs": Lazy(len(plan.outputs), lambda: (
            io_entry(plan, index, shapes, names.output(i))
            for i, index in enumerate(plan.outputs))),
        "symbols": {name: {"min": r.lower, "max": r.upper}
                    for name, r in (shapes.symbols.items() if shapes else [])},
        "chains": len(plan.chains),
        "constant": constant_value(plan),
        "instruction_count": instruction_count,
        "kernel_calls": sum(calls.values()),
        "operators": Lazy(len(plan.operators), lambda: (
            {"index": i, "name": op.name, "overload": op.overload, "calls": calls.get(i, 0)}
            for i, op in enumerate(plan.operators))),
        "memory_plan": {
            "buffers": _BUFFER.rows(buffers, lambda: ((i, size) for i, size in enumerate(sizes)
                                                      if i > 0 or size)),
            "total_bytes": sum(sizes),
            "planned_tensors": sum(1 for v in plan.values
                                   if isinstance(v, P.Tensor) and v.allocation_info),
        },
        "state": Lazy(state_count, lambda: state_entries(plan)),
        "delegates": Lazy(len(payloads), lambda: (describe_delegate(program, p, key_users)
                                                  for p in payloads)),
        "values": {"count": len(plan.values), "kinds": dict(sorted(value_kinds.items()))},
        "instructions": Lazy(instruction_count, lambda: _instructions(plan, context, modules)),
    }


_SCALARS = {P.Int: "int_val", P.Double: "double_val", P.Bool: "bool_val",
            P.String: "string_val"}


def constant_value(plan: P.ExecutionPlan) -> Any:
    """What a constant method returns (no inputs, no work, scalar outputs: what
    `constant_methods` make), or None for any other method."""
    if plan.inputs or plan.delegates or not plan.outputs or \
            any(chain.instructions for chain in plan.chains) or \
            not all(0 <= i < len(plan.values) and type(plan.values[i]) in _SCALARS
                    for i in plan.outputs):
        return None
    values = [getattr(plan.values[i], _SCALARS[type(plan.values[i])]) for i in plan.outputs]
    spec = plan.container_meta_type.encoded_out_str if plan.container_meta_type else ""
    return values if "builtins.list" in spec or len(values) != 1 else values[0]


def _instructions(plan: P.ExecutionPlan, context: ListingContext,
                  modules: list[list[str]] | None) -> Iterator[dict[str, Any]]:
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            frames = chain.stacktrace[i].items if chain.stacktrace else []
            yield {
                "chain": c,
                "index": i,
                "kind": type(instr).__name__,
                "text": instruction_text(plan, instr, context),
                "source": source_of(frames),
                # The submodule it came from (`encoder.layers.1.linear`); None if unknown.
                "module": (modules[c][i] or None) if modules is not None else None,
                **{f.name: _plain(getattr(instr, f.name)) for f in dataclasses.fields(instr)},
            }


def _plain(field: Any) -> Any:
    """A field as JSON has it: a call's arguments as the reader keeps them
    (`P.Args`) are a list."""
    return field.tolist() if isinstance(field, P.Args) else field


def _state_values(plan: P.ExecutionPlan) -> Iterator[tuple[int, P.Tensor, str | None]]:
    """(index, tensor, name) of each tensor that is program state."""
    for index, value in enumerate(plan.values):
        if not isinstance(value, P.Tensor) or value.allocation_info is None:
            continue
        name = value.extra_tensor_info.fully_qualified_name if value.extra_tensor_info else None
        if value.data_buffer_idx or name or value.allocation_info.memory_id >= 2:
            yield index, value, name


def state_entries(plan: P.ExecutionPlan) -> Iterator[dict[str, Any]]:
    """The tensors that are program state: planned memory kept from run to run
    (a buffer the model updates), with an initial value, a name, or in a shared
    buffer (id 2 on)."""
    for index, value, name in _state_values(plan):
        assert value.allocation_info is not None
        yield {"value": index, "name": name, "type": value_type(value, None),
               "buffer": value.allocation_info.memory_id,
               "offset": value.allocation_info.offset,
               "bytes": value.nbytes, "initial_value": bool(value.data_buffer_idx)}


def io_entry(plan: P.ExecutionPlan, index: int, shapes: MethodShapes | None = None,
             name: str | None = None) -> dict[str, Any]:
    value = plan.values[index]
    dims = shapes.describe_dims(index) if shapes is not None else None
    entry: dict[str, Any] = {"name": name, "value": index, "kind": type(value).__name__, "type":
                             value_type(value, dims)}
    if isinstance(value, P.Tensor):
        entry.update(
            dtype=value.scalar_type.short_name,
            shape=list(value.sizes),
            dynamism=value.shape_dynamism.name.lower(),
            bytes=value.nbytes,
        )
        if shapes is not None and index in shapes.values:
            entry["dims"] = shapes.values[index]  # sizes, or expressions over symbols
    return entry


def delegate_bytes(program: P.Program, delegate: P.BackendDelegate) -> int:
    """The size of a delegate's payload (`delegates.payload_data` has its bytes)."""
    return len(payload_data(program, delegate))
