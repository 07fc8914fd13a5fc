"""The metadata exirc's passes leave on graphs, one pair of accessors per key.

torch.fx keeps free-form dicts (`node.meta`, `graph_module.meta`); reading
them with bare strings in many modules hides who writes what. Every key exirc
writes is here, with what it holds, who writes it and who reads it:

    key (where)                          holds                   written by -> read by
    exirc_memory (node)                  (memory id, offset)     memory_plan -> emit, limits
    exirc_memory_plan (graph module)     the method's MemoryPlan memory_plan -> emit, report
    exirc_constant_name (placeholder)    a constant's name       constant passes -> size report
    exirc_state (placeholder)            its StateSlot           ir.state -> every stage
    exirc_delegation (graph module)      a DelegationReport      delegate -> compile report

The strings are private to the compiler (never written to files), so they
can change; the accessors are the interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

    from exirc.ir.state import StateSlot
    from exirc.plan.placement import MemoryPlan

_MEMORY = "exirc_memory"
_MEMORY_PLAN = "exirc_memory_plan"
_CONSTANT_NAME = "exirc_constant_name"
_STATE = "exirc_state"


def planned_memory(node: Node) -> tuple[int, int] | None:
    """Where the memory plan put `node`'s tensor: (memory id, byte offset), or None."""
    memory: Any = node.meta.get(_MEMORY)
    return memory


def set_planned_memory(node: Node, memory_id: int, offset: int) -> None:
    node.meta[_MEMORY] = (memory_id, offset)


def memory_plan(graph_module: GraphModule) -> MemoryPlan | None:
    """The memory plan of a method's graph, or None before memory planning."""
    plan: Any = graph_module.meta.get(_MEMORY_PLAN)
    return plan


def set_memory_plan(graph_module: GraphModule, plan: MemoryPlan | None) -> None:
    """Record a method's memory plan; None forgets it."""
    if plan is None:
        graph_module.meta.pop(_MEMORY_PLAN, None)
    else:
        graph_module.meta[_MEMORY_PLAN] = plan


def constant_name(node: Node) -> str | None:
    """What a constant a pass made is, for people: "fc1.weight (permute_copy)"."""
    name: Any = node.meta.get(_CONSTANT_NAME)
    return name


def set_constant_name(node: Node, name: str) -> None:
    node.meta[_CONSTANT_NAME] = name


def state_slot(node: Node) -> StateSlot | None:
    """The state slot of a placeholder, or None if it is not program state."""
    slot: Any = node.meta.get(_STATE) if node.op == "placeholder" else None
    return slot


def set_state_slot(node: Node, slot: StateSlot) -> None:
    node.meta[_STATE] = slot


_DELEGATION = "exirc_delegation"


def delegation_report(graph_module: GraphModule) -> Any:
    """The `DelegationReport` the delegate pass left on a method's graph, or None."""
    return graph_module.meta.get(_DELEGATION)


def set_delegation_report(graph_module: GraphModule, report: Any) -> None:
    graph_module.meta[_DELEGATION] = report


_ATTENTION = "exirc_attention"


def attention_report(graph_module: GraphModule) -> Any:
    """The `AttentionReport` the bind_kv_attention pass left on a method's graph, or None."""
    return graph_module.meta.get(_ATTENTION)


def set_attention_report(graph_module: GraphModule, report: Any) -> None:
    graph_module.meta[_ATTENTION] = report


def carry_method_notes(before: GraphModule, after: GraphModule) -> None:
    """Keep the notes passes left on a method's graph (`exirc_*` keys) when a
    pass makes a new graph module of it (torch's decomposition does)."""
    for key, value in before.meta.items():
        if key.startswith("exirc_"):
            after.meta.setdefault(key, value)
