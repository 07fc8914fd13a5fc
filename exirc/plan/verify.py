"""The verifier of the out-variant form, run after the plan stage.

Two checks, the program's last before emit: the target's runtime has a
kernel for every call (`exirc.plan.kernels`), and the memory plan the emitter
will write is sound.

`memory_plan` proves the plan it makes, but it is not the last word: a pass
after it in a user's pipeline may move a tensor (its `planned_memory`) or make
one live longer, and the emitter writes whatever offsets the final graph
carries. So after every plan pass has run, the lifetimes are measured again
on the final graph, the arena offsets read back from it, and the pair check
of `check_plan` run on them: an unsound plan fails the compile with an
InternalError naming both tensors, their lifetimes and byte ranges, and no
file is written.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from torch.export.graph_signature import InputKind, TensorArgument

from exirc.errors import InternalError
from exirc.ir.meta import memory_plan, planned_memory
from exirc.plan.kernels import check_kernels
from exirc.plan.lifetimes import Lifetime, tensor_lifetimes
from exirc.plan.memory_plan import ARENA_ID
from exirc.plan.ops import alias_view
from exirc.plan.placement import MemoryPlan, check_plan

if TYPE_CHECKING:
    from torch.export import ExportedProgram

_HINT = ("this is a bug in exirc, or in a pass your pipeline runs after memory_plan; "
         "please report it with the command you ran and --debug output")


def verify_plan(program: ExportedProgram, target: str, kernels: Iterable[str] = ()) -> None:
    """Check an out-variant program: `target` (or a plugin's `kernels`) runs every
    call, and its final memory plan is sound."""
    check_kernels(program.graph_module, target, kernels)
    verify_memory_plan(program)


def verify_memory_plan(program: ExportedProgram) -> None:
    """Prove the final arena plan of an out-variant, memory-planned program sound.

    Takes the program after the plan stage (out-variant Edge/Backend dialect)
    and changes nothing; raises InternalError when two tensors live at the
    same time share arena bytes, or a planned tensor has no place in the
    arena. A program no `memory_plan` ran on has no plan to check.
    """
    graph_module = program.graph_module
    recorded = memory_plan(graph_module)
    if not isinstance(recorded, MemoryPlan):
        return
    lifetimes = tensor_lifetimes(graph_module.graph, _user_tensor_inputs(program),
                                 view_ops={alias_view})
    # Tensors placed in memory of their own (not the arena) share no arena bytes.
    in_arena = [lt for lt in lifetimes if _memory_id(lt) in (None, ARENA_ID)]
    offsets = {lt.node: _offset(lt) for lt in in_arena
               if _memory_id(lt) is not None}  # a tensor without one: check_plan names it
    final = MemoryPlan(offsets, recorded.arena_bytes, recorded.lower_bound,
                       recorded.alignment, recorded.algorithm)
    try:
        check_plan(in_arena, final)
    except InternalError as error:
        raise InternalError(error.message, hint=_HINT) from None


def _offset(lt: Lifetime) -> int:
    memory = planned_memory(lt.node)
    assert memory is not None
    return memory[1]


def _memory_id(lt: Lifetime) -> int | None:
    memory = planned_memory(lt.node)
    return None if memory is None else int(memory[0])


def _user_tensor_inputs(program: ExportedProgram) -> set[str]:
    """The placeholders memory_plan plans: tensor user inputs, live from the start."""
    return {
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument)
    }
