"""The memory planning pass: lifetimes -> plan -> proof -> annotations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument

from exirc.ir.meta import set_memory_plan, set_planned_memory, state_slot
from exirc.ir.state import STATE_MEMORY_ID
from exirc.passes.contract import Pass, PassResult
from exirc.plan.lifetimes import tensor_lifetimes
from exirc.plan.ops import alias_view
from exirc.plan.placement import check_plan, plan_memory

# Memory id 0 is reserved (as in ExecuTorch's files); the planned arena is id 1.
ARENA_ID = 1


@dataclass(frozen=True)
class MemoryPlanPass(Pass):
    """Out-variant form -> the same, every planned tensor placed in one arena.

    Every op of the out-variant form writes into an `alloc` node through its
    out arguments; this pass places them, and proves the plan sound. Records each user
    input's and alloc node's `planned_memory` (memory id 1, offset), and the
    method's `memory_plan` (arena size, lower bound) for the emitter and the
    compile report (`exirc.ir.meta`).
    """

    name: ClassVar[str] = "memory_plan"
    alignment: int = 16
    algorithm: str = "greedy_best"

    def run(self, program: ExportedProgram) -> PassResult:
        graph_module = program.graph_module
        user_inputs = {
            spec.arg.name
            for spec in program.graph_signature.input_specs
            if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument)
        }
        lifetimes = tensor_lifetimes(graph_module.graph, user_inputs, view_ops={alias_view})
        plan = plan_memory(lifetimes, alignment=self.alignment, algorithm=self.algorithm)
        check_plan(lifetimes, plan)
        for lt in lifetimes:
            set_planned_memory(lt.node, ARENA_ID, plan.offsets[lt.node])
        for node in graph_module.graph.nodes:
            slot = state_slot(node)
            if slot is not None:  # program state: its own slot, for every call
                set_planned_memory(node, STATE_MEMORY_ID, slot.offset)
        set_memory_plan(graph_module, plan)
        return PassResult(program, changed=True)
