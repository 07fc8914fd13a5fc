"""Reading and editing the constant inputs of an ExportedProgram.

torch.export lifts parameters, buffers and tensor constants to placeholders
that the graph signature describes. Passes that fold or drop constants must
keep three things in step: the placeholder, its `InputSpec`, and the tensor
in `state_dict` or `constants`. These helpers are the one place that does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from exirc.ir.control_flow import unused_placeholder_name
from exirc.ir.meta import set_constant_name, state_slot

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node

CONSTANT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)

def input_specs_by_name(program: ExportedProgram) -> dict[str, InputSpec]:
    return {
        spec.arg.name: spec
        for spec in program.graph_signature.input_specs
        if isinstance(spec.arg, TensorArgument)
    }


def mutated_buffers(program: ExportedProgram) -> set[str]:
    """Targets of buffers the program writes: never constant."""
    return set(program.graph_signature.buffers_to_mutate.values())


def input_target(program: ExportedProgram, node: Node) -> str | None:
    """The parameter, buffer or constant a placeholder lifts (`fc1.weight`)."""
    spec = input_specs_by_name(program).get(node.name)
    return spec.target if spec is not None else None


def constant_tensor(program: ExportedProgram, node: Node) -> torch.Tensor | None:
    """The tensor behind a constant placeholder, or None if `node` is not one."""
    if node.op != "placeholder":
        return None
    spec = input_specs_by_name(program).get(node.name)
    if spec is None or spec.kind not in CONSTANT_KINDS or spec.target is None:
        return None
    if spec.target in mutated_buffers(program) or state_slot(node) is not None:
        return None  # program state: its value changes from call to call
    if spec.target in program.constants:
        value = program.constants[spec.target]
    else:
        value = program.state_dict.get(spec.target)
    return value if isinstance(value, torch.Tensor) else None


def add_constant(program: ExportedProgram, name: str, value: torch.Tensor,
                 described: str | None = None) -> Node:
    """A new constant placeholder holding `value`, placed before user inputs.

    `described` says what it is for people (its `constant_name`, for the size report)."""
    graph = program.graph_module.graph
    name = unused_placeholder_name(graph, name)
    specs = program.graph_signature.input_specs
    first_user = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT),
                      len(specs))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = placeholders[first_user] if first_user < len(placeholders) else None
    if anchor is not None:
        with graph.inserting_before(anchor):
            node = graph.placeholder(name)
    else:
        last = placeholders[-1] if placeholders else None
        ctx = graph.inserting_after(last) if last is not None else graph.inserting_before()
        with ctx:
            node = graph.placeholder(name)
    node.meta["val"] = _fake_like(program, value)
    if described:
        set_constant_name(node, described)
    specs.insert(first_user, InputSpec(kind=InputKind.CONSTANT_TENSOR,
                                       arg=TensorArgument(name=node.name), target=node.name,
                                       persistent=None))
    program.constants[node.name] = value
    return node


def remove_constant(program: ExportedProgram, node: Node) -> None:
    """Drop an unused constant placeholder with its spec and tensor."""
    specs = program.graph_signature.input_specs
    for i, spec in enumerate(specs):
        if isinstance(spec.arg, TensorArgument) and spec.arg.name == node.name:
            del specs[i]
            target = spec.target
            if target is not None:
                program.constants.pop(target, None)
                program.state_dict.pop(target, None)
            break
    program.graph_module.graph.erase_node(node)


def _fake_like(program: ExportedProgram, value: torch.Tensor) -> torch.Tensor:
    """A FakeTensor for `value` in the program's fake mode (for meta["val"])."""
    for node in program.graph_module.graph.nodes:
        fake = node.meta.get("val")
        mode = getattr(fake, "fake_mode", None)
        if mode is not None:
            return mode.from_tensor(value, static_shapes=True)
    return value
