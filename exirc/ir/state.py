"""Program state: buffers that `forward` updates in place (KV caches, counters).

A buffer the model mutates is not a constant: its value must persist from one
call to the next, start from the value it had when the model was compiled,
and be one value for every method of the file that touches it (the
prefill/decode pattern of an LLM with a static KV cache).

The compiler finds such buffers in the captured (ATen) methods before any
pass runs, gives each one a slot in the *state arena* and marks its
placeholders (`exirc.ir.meta.state_slot`), in every method that reads or writes it:

    passes      never fold or drop a marked placeholder (it is not constant)
    write_back  the functional graph's buffer-mutation outputs become
                `copy_(state, new_value)` at the end, and leave the outputs
    plan        a marked placeholder lives at its slot in memory id 2
    emit        a planned tensor with an initial value (ExecuTorch's
                `mutable_data_segments`) and its name

The state arena is memory id 2 with one layout for all methods, as
ExecuTorch's `share_mutable_buffers` convention has it: a runtime that gives
every method the same memory for id 2 shares the state between methods.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

from exirc.errors import ModelError
from exirc.ir.meta import set_state_slot, state_slot
from exirc.serialize import program as P

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node

# The memory id of the state arena (1 is the per-method activation arena).
STATE_MEMORY_ID = P.FIRST_SHARED_BUFFER
STATE_ALIGNMENT = 16


@dataclass(frozen=True)
class StateSlot:
    """Where one state buffer lives: its name (stored in the file) and bytes."""

    name: str
    offset: int
    nbytes: int


@dataclass
class StateLayout:
    """Every state buffer of a program, and the size of the state arena."""

    slots: dict[str, StateSlot] = field(default_factory=dict)
    arena_bytes: int = 0

    def __bool__(self) -> bool:
        return bool(self.slots)


class StateLayoutError(ModelError):
    """Two methods of one program read one state in different layouts."""

    code = "E0314"
    default_hint = ("the attention over that cache is bound to ExecuTorch's llama ops "
                    "(--target xnnpack-llm) in one method only, which lays the cache out "
                    "[B, S, H, D]; --explain-delegation says why the other was left "
                    "decomposed. Make both match, or compile with --target xnnpack")


def plan_state(methods: dict[str, ExportedProgram]) -> StateLayout:
    """Find the state buffers of `methods`, lay them out, and mark their placeholders.

    A buffer is state if any method writes it. The same tensor lifted by
    several methods (even under different names, e.g. through different
    wrapper modules) is one state, named by the first name it was seen under.
    """
    by_tensor: dict[int, str] = {}  # id(tensor) -> state name
    for program in methods.values():
        adopt_written_constants(program)
        for target in _written_buffers(program):
            tensor = buffer_value(program, target)
            if tensor is not None:
                by_tensor.setdefault(id(tensor), target)
    layout = StateLayout()
    for program in methods.values():
        for node, target in _buffer_placeholders(program):
            tensor = buffer_value(program, target)
            name = by_tensor.get(id(tensor)) if isinstance(tensor, torch.Tensor) else None
            if name is None:
                continue
            slot = layout.slots.get(name)
            if slot is None:
                assert isinstance(tensor, torch.Tensor)
                nbytes = tensor.numel() * tensor.element_size()
                slot = StateSlot(name, layout.arena_bytes, nbytes)
                layout.slots[name] = slot
                layout.arena_bytes += -(-nbytes // STATE_ALIGNMENT) * STATE_ALIGNMENT
            set_state_slot(node, slot)
    return layout


def buffer_value(program: ExportedProgram, target: str) -> torch.Tensor | None:
    """The tensor a buffer placeholder lifts, persistent or not.

    torch.export keeps a buffer registered with `persistent=False` (the KV
    caches of ExecuTorch's llama and of transformers' static-cache wrapper) in
    `constants`, not in `state_dict`; both are the module's own tensor, so the
    same buffer seen by two methods is one tensor either way.
    """
    tensor = program.state_dict.get(target)
    if tensor is None:
        tensor = program.constants.get(target)
    return tensor if isinstance(tensor, torch.Tensor) else None


def adopt_written_constants(program: ExportedProgram) -> None:
    """ATen -> ATen: tensor constants the method writes become buffers.

    torch.export lifts a tensor the model reaches through a plain Python object
    (transformers' `StaticCache` keeps its layers' caches so) as a constant,
    even when the same tensor is also a registered buffer; an in-place write to
    a constant then fails inside torch's decomposition. Such a write makes the
    tensor state: its placeholder becomes the buffer holding the same tensor
    (one state under the buffer's name), or a non-persistent buffer of its own.
    """
    specs = program.graph_signature.input_specs
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    buffer_nodes = {id(tensor): placeholders[spec.arg.name] for spec in specs
                    if spec.kind == InputKind.BUFFER and isinstance(spec.arg, TensorArgument)
                    and spec.target is not None
                    and (tensor := buffer_value(program, spec.target)) is not None}
    adopted: list[InputSpec] = []
    changed = False
    for spec in specs:
        node = placeholders.get(spec.arg.name) if isinstance(spec.arg, TensorArgument) else None
        if spec.kind != InputKind.CONSTANT_TENSOR or node is None or spec.target is None \
                or not _written(node):
            adopted.append(spec)
            continue
        changed = True
        buffer = buffer_nodes.get(id(program.constants.get(spec.target)))
        if buffer is None:
            adopted.append(InputSpec(InputKind.BUFFER, spec.arg, spec.target, persistent=False))
            continue
        node.replace_all_uses_with(buffer)
        program.graph.erase_node(node)
        program.constants.pop(spec.target, None)
    if changed:
        specs[:] = adopted
        program.graph_module.recompile()


def is_stateful(program: ExportedProgram) -> bool:
    """Whether a (marked) method reads or writes program state."""
    return any(state_slot(node) is not None for node in program.graph.nodes)


def _buffer_placeholders(program: ExportedProgram) -> Iterator[tuple[Node, str]]:
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs
             if isinstance(spec.arg, TensorArgument)}
    for node in program.graph.nodes:
        spec = specs.get(node.name) if node.op == "placeholder" else None
        if spec is not None and spec.kind == InputKind.BUFFER and spec.target is not None:
            yield node, spec.target


def written_inputs(program: ExportedProgram) -> set[str]:
    """The placeholders of the buffers and tensor constants a captured method
    writes (its program state, once planned: `plan_state`): a KV cache, a
    counter. Not weights, and a sign the method depends on what came before."""
    mutated = set(program.graph_signature.buffers_to_mutate.values())
    found = set()
    for spec in program.graph_signature.input_specs:
        if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR) and \
                isinstance(spec.arg, TensorArgument) and spec.target in mutated:
            found.add(spec.arg.name)
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name not in found and _written(node) and \
                _lifted(program, node.name):
            found.add(node.name)
    return found


def _lifted(program: ExportedProgram, name: str) -> bool:
    return any(spec.arg.name == name and spec.kind in (InputKind.BUFFER,
                                                       InputKind.CONSTANT_TENSOR)
               for spec in program.graph_signature.input_specs
               if isinstance(spec.arg, TensorArgument))


def _written_buffers(program: ExportedProgram) -> set[str]:
    """Buffers the program writes: functional mutation outputs (after
    decomposition), or in-place ops on the buffer (torch.export's ATen graph)."""
    written = set(program.graph_signature.buffers_to_mutate.values())
    written.update(target for node, target in _buffer_placeholders(program) if _written(node))
    return written


def _written(node: Node) -> bool:
    """Whether an in-place op writes `node` or a view of it."""
    return any(_writes(user, alias) for alias in _aliases(node) for user in alias.users)


def _aliases(node: Node) -> list[Node]:
    """`node` and the views of it (`cache[:, pos].copy_(k)` writes the cache)."""
    found, pending = [node], [node]
    while pending:
        for user in pending.pop().users:
            target = user.target
            if isinstance(target, torch._ops.OpOverload) and target.is_view \
                    and user.args and user.args[0] in found and user not in found:
                found.append(user)
                pending.append(user)
    return found


def _writes(user: Node, value: Node) -> bool:
    """Whether the call `user` writes into its argument `value` (an in-place op)."""
    schema = getattr(user.target, "_schema", None) if user.op == "call_function" else None
    if schema is None:
        return False
    for position, argument in enumerate(schema.arguments):
        given = user.kwargs.get(argument.name) if argument.kwarg_only or \
            position >= len(user.args) else user.args[position]
        if given is value and argument.alias_info is not None and argument.alias_info.is_write:
            return True
    return False
