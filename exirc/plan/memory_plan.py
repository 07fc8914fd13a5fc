"""The memory planning pass: lifetimes -> plan -> proof -> annotations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, TensorArgument

from exirc.ir.state import STATE_MEMORY_ID, state_slot
from exirc.passes.contract import Pass, PassResult
from exirc.plan.alias_views import alias_view
from exirc.plan.lifetimes import tensor_lifetimes
from exirc.plan.placement import check_plan, plan_memory

# Memory id 0 is reserved (as in ExecuTorch's files); the planned arena is id 1.
ARENA_ID = 1


@dataclass(frozen=True)
class MemoryPlanPass(Pass):
    """Give every planned tensor a place in one arena, and prove the plan sound.

    Takes and returns the out-variant Edge/Backend dialect program (every op
    writes into an `alloc` node through its out arguments). Records
    `node.meta["memory"] = (1, offset)` on each user input and alloc node, and
    the `MemoryPlan` (arena size, lower bound) in
    `graph_module.meta["memory_plan"]` for the emitter and the compile report.
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
            lt.node.meta["memory"] = (ARENA_ID, plan.offsets[lt.node])
        for node in graph_module.graph.nodes:
            slot = state_slot(node)
            if slot is not None:  # program state: its own slot, for every call
                node.meta["memory"] = (STATE_MEMORY_ID, slot.offset)
        graph_module.meta["memory_plan"] = plan
        return PassResult(program, changed=True)
