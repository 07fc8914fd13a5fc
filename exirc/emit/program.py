"""All methods -> one `Program`, sharing deduplicated constant data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.fx import Node

from exirc.backend.delegation.lowered import LoweredDelegate
from exirc.emit import delegates
from exirc.emit.constant_methods import constant_plan
from exirc.emit.constants import ConstantTable
from exirc.emit.external import move_weights
from exirc.emit.io_names import method_io_names
from exirc.emit.method import MethodEmitter
from exirc.emit.module_paths import instruction_module_paths
from exirc.emit.shapes import method_shapes
from exirc.ir.state import STATE_ALIGNMENT
from exirc.plan.placement import round_up
from exirc.serialize import io_names, module_paths, symbolic_shapes
from exirc.serialize import program as P
from exirc.serialize.data_file import DataFile

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclass
class EmittedProgram:
    program: P.Program
    # Per method, the graph node each instruction of chain 0 was made for
    # (nodes of subgraphs included), so diagnostics can map back to the graph.
    instruction_nodes: dict[str, list[Node]]
    # With external weights: the data file holding them (`exirc.emit.external`).
    data_file: DataFile | None = None


def emit_program(methods: dict[str, ExportedProgram]) -> P.Program:
    """Out-variant, memory-planned methods -> the program model."""
    return emit_methods(methods).program


def emit_methods(methods: dict[str, ExportedProgram],
                 constant_methods: Mapping[str, Any] | None = None,
                 external_weights: bool = False) -> EmittedProgram:
    """Out-variant, memory-planned methods -> the program model, and where each
    instruction comes from; `constant_methods` (name -> value) follow the methods.
    `external_weights`: constants and delegate weights go to a data file instead."""
    constants = ConstantTable()
    program = P.Program()
    delegated: list[tuple[P.ExecutionPlan, list[LoweredDelegate]]] = []
    shapes = {}
    names: dict[str, io_names.MethodNames] = {}
    nodes = {}
    modules: dict[str, list[list[str]]] = {}
    stateful: list[P.ExecutionPlan] = []
    state_bytes = 0
    for name, exported in methods.items():
        emitter = MethodEmitter(name, exported, constants)
        plan = emitter.emit()
        program.execution_plan.append(plan)
        if emitter.state_bytes:
            stateful.append(plan)
            state_bytes = max(state_bytes, emitter.state_bytes)
        nodes[name] = emitter.instruction_nodes
        delegated.append((plan, emitter.lowered))
        # per instruction of chain 0, the only chain the emitter makes
        paths = instruction_module_paths(emitter.instruction_nodes, exported.graph_module)
        if paths is not None:
            modules[name] = [paths]
        io = method_io_names(exported, emitter.input_names, len(plan.outputs))
        if io is not None:
            names[name] = io
        method = method_shapes(emitter.table.symbolic_dims, exported)
        if method is not None:
            shapes[name] = method
    # One state arena, the same size in every method that has state, so a
    # runtime can give them all the same memory (shared state).
    for plan in stateful:
        plan.non_const_buffer_sizes.append(round_up(state_bytes, STATE_ALIGNMENT))
    for name, value in (constant_methods or {}).items():
        program.execution_plan.append(constant_plan(name, value))
    data_file = move_weights(program, constants) if external_weights else None
    constants.attach(program)
    for plan, lowered in delegated:
        delegates.attach(program, plan, lowered, constants, data_file)
    if shapes:
        program.add_named_segment(symbolic_shapes.NAMED_DATA_KEY, symbolic_shapes.encode(shapes),
                                  packed=True)
    if names:
        program.add_named_segment(io_names.NAMED_DATA_KEY, io_names.encode(names),
                                  packed=True)
    if modules:
        program.add_named_segment(module_paths.NAMED_DATA_KEY, module_paths.encode(modules),
                                  packed=True)
    return EmittedProgram(program, nodes, data_file)
