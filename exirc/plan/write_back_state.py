"""Buffer updates become writes into the program's state, not extra outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from exirc.errors import InternalError
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node

# What the functional graph returns besides the user's outputs: new values
# of mutated buffers, and of user inputs the model writes into.
MUTATION_KINDS = (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)


@dataclass(frozen=True)
class WriteBackState(Pass):
    """Edge/Backend (functional) -> the same dialect, updates written in place.

    torch.export's functional graph returns each mutated buffer's new value as
    an extra output. This pass writes it into the buffer itself with
    `aten::copy_` after everything else has run, and drops those outputs, so a
    method returns only what the model returns and the buffer (program state,
    see `exirc.ir.state`) carries the update to the next call. An input the model
    writes into is updated the same way, as ExecuTorch does.
    """

    name: ClassVar[str] = "write_back_state"

    def run(self, program: ExportedProgram) -> PassResult:
        graph = program.graph_module.graph
        output = graph.output_node()
        values = list(output.args[0])
        specs = program.graph_signature.output_specs
        if len(values) != len(specs) or not any(s.kind in MUTATION_KINDS for s in specs):
            return PassResult(program, changed=False)
        destinations = _mutated_placeholders(program)
        kept: list[tuple[object, object]] = []
        for spec, value in zip(specs, values):
            if spec.kind not in MUTATION_KINDS:
                kept.append((spec, value))
                continue
            destination = destinations.get((spec.kind, spec.target))
            if destination is None:
                raise InternalError(f"output {spec.arg} updates {spec.target!r}, which is not "
                                    "an input of the method")
            if value is not destination:
                with graph.inserting_before(output):
                    write = graph.call_function(torch.ops.aten.copy_.default,
                                                (destination, value))
                write.meta["val"] = destination.meta.get("val")
                write.meta["stack_trace"] = getattr(value, "meta", {}).get("stack_trace")
        output.args = (tuple(value for _, value in kept),)
        specs[:] = [spec for spec, _ in kept]
        program.graph_module.recompile()
        return PassResult(program, changed=True)


def _mutated_placeholders(program: ExportedProgram) -> dict[tuple[OutputKind, str], Node]:
    """(mutation kind, spec target) -> the placeholder the update writes into."""
    nodes = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    found: dict[tuple[OutputKind, str], Node] = {}
    for spec in program.graph_signature.input_specs:
        if not isinstance(spec.arg, TensorArgument) or spec.arg.name not in nodes:
            continue
        node = nodes[spec.arg.name]
        if spec.kind == InputKind.BUFFER and spec.target is not None:
            found[(OutputKind.BUFFER_MUTATION, spec.target)] = node
        elif spec.kind == InputKind.USER_INPUT:
            found[(OutputKind.USER_INPUT_MUTATION, spec.arg.name)] = node
    return found
