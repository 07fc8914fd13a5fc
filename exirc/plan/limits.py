"""Memory budgets: `exirc compile --max-arena SIZE` fails when a plan needs more.

A device has so much RAM for activations; finding out at compile time beats
finding out on the device. The check runs after memory planning and before
emitting, so an over-budget compile writes nothing. Its error lists what a
user can act on: the planned arena, the lower bound (no plan can beat it, so
it says whether a better plan could ever fit), and the largest planned
tensors with the source lines that made them.

Sizes on the command line are bytes, or KiB/MiB/GiB with a K/M/G (or
KiB/MiB/GiB) suffix: `--max-arena 256K` is 262144 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from exirc.errors import ExircError, UsageError
from exirc.ir.meta import memory_plan, planned_memory
from exirc.ir.source import source_location

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from torch.fx import Node

# The largest planned tensors an ArenaLimitError lists.
LARGEST_SHOWN = 3



class ArenaLimitError(ExircError):
    """A method's planned memory arena is bigger than the limit (--max-arena).

    Exit code 3 like the other model errors: the model, at its shape bounds,
    does not fit the budget; the command line itself was fine.
    """

    exit_code = 3
    code = "E0312"


def format_size(nbytes: int) -> str:
    """`96 bytes`, or `256.0 KiB (262,144 bytes)` when a rounded unit would hide bytes."""
    if nbytes < 1024:
        return f"{nbytes} bytes"
    size, units = nbytes / 1024, ["KiB", "MiB", "GiB"]
    while size >= 1024 and len(units) > 1:
        size, units = size / 1024, units[1:]
    return f"{size:.1f} {units[0]} ({nbytes:,} bytes)"


def check_arena_limit(methods: Mapping[str, ExportedProgram], limit: int | None) -> None:
    """Raise ArenaLimitError for the first method whose planned arena exceeds `limit`.

    `methods` are planned programs (the memory_plan pass put a `MemoryPlan`
    as its `memory_plan`); a method without a plan has no
    planned memory and so always fits. `limit` None means no limit.
    """
    if limit is None:
        return
    if limit < 0:
        raise UsageError(f"the arena limit must be a non-negative number of bytes, not {limit}")
    for name, program in methods.items():
        plan = memory_plan(program.graph_module)
        if plan is not None and plan.arena_bytes > limit:
            raise _over_limit(name, program, plan.arena_bytes, plan.lower_bound, limit)


def _over_limit(method: str, program: ExportedProgram, arena: int, lower_bound: int,
                limit: int) -> ArenaLimitError:
    largest = ", ".join(_describe(node, nbytes)
                        for node, nbytes in largest_planned_tensors(program)[:LARGEST_SHOWN])
    message = (f"method {method!r} needs a memory arena of {format_size(arena)}, over the "
               f"limit of {format_size(limit)} (lower bound {format_size(lower_bound)}); "
               f"largest planned tensors: {largest or 'none'}")
    if lower_bound > limit:
        why = "no plan fits: even the lower bound (the most bytes live at once) is over it"
    else:
        why = "the lower bound fits, this plan does not"
    return ArenaLimitError(message, hint=f"{why}; reduce batch/sequence bounds (the largest "
                                         "tensors are listed), or raise --max-arena")


def largest_planned_tensors(program: ExportedProgram) -> list[tuple[Node, int]]:
    """Planned tensors (nodes with a `planned_memory`) and their bytes, largest first.

    Sizes are measured as the planner measured them (dynamic dims at their
    upper bounds), by the same function; only a failing check pays for it.
    """
    from exirc.plan.lifetimes import tensor_lifetimes
    from exirc.plan.ops import alias_view

    graph = program.graph_module.graph
    user_inputs = {node.name for node in graph.nodes
                   if node.op == "placeholder" and planned_memory(node) is not None}
    lifetimes = tensor_lifetimes(graph, user_inputs, view_ops={alias_view})
    planned = [lt for lt in lifetimes if planned_memory(lt.node) is not None]
    order = {lt.node: i for i, lt in enumerate(planned)}
    return [(lt.node, lt.nbytes)
            for lt in sorted(planned, key=lambda lt: (-lt.nbytes, order[lt.node]))]


def _describe(node: Node, nbytes: int) -> str:
    """`%relu [3, 8] float32 96 bytes at model.py:7: return torch.relu(x)`."""
    shown = _producer(node)
    text = f"%{shown.name}{_shape(node)} {format_size(nbytes)}"
    if node.op == "placeholder":
        return f"{text} (an input)"
    where = source_location(shown) or source_location(node)
    return f"{text} at {where}" if where else text


def _producer(node: Node) -> Node:
    """The op that writes an `alloc` node's memory (its name means something to
    a user; `alloc_3` does not), else the node itself."""
    for user in node.users:
        if node in user.kwargs.values():
            return user
    return node


def _shape(node: Node) -> str:
    value: Any = node.meta.get("val")
    shape = getattr(value, "shape", None)
    if shape is None:
        return ""
    dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
    return f" [{', '.join(str(d) for d in shape)}] {dtype}"
