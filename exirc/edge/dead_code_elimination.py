"""Dead code elimination, including constants nothing reads any more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from exirc.edge.constants import constant_tensor, remove_constant
from exirc.ir.control_flow import graph_modules, is_control_flow, remove_unused_operands
from exirc.passes.contract import Pass, PassResult

if TYPE_CHECKING:
    from torch.export import ExportedProgram


@dataclass(frozen=True)
class DeadCodeElimination(Pass):
    """Any dialect -> same dialect: drop unused pure nodes and unused constants.

    User inputs stay even when unused: they are the method's signature.
    """

    name: ClassVar[str] = "dead_code_elimination"

    def run(self, program: ExportedProgram) -> PassResult:
        graph = program.graph_module.graph
        changed = False
        # Subgraphs first: what they stop reading, their parent may then drop.
        for module in reversed(list(graph_modules(program.graph_module))):
            pruned = False
            for node in module.graph.nodes:
                if is_control_flow(node):
                    pruned |= remove_unused_operands(module, node)
            if module.graph.eliminate_dead_code() or pruned:
                module.recompile()
                changed = True
        for node in list(graph.nodes):
            if node.op == "placeholder" and not node.users and \
                    constant_tensor(program, node) is not None:
                remove_constant(program, node)
                changed = True
        if changed:
            program.graph_module.recompile()
        return PassResult(program, changed)
