"""Kernel checks: whether a target's runtime has a kernel for every op of a graph.

The targets and their kernel sets are data (`exirc.targets`); this module
adds the compiler's side: exirc's backend ops, out-variants, and the errors.
`check_kernels` runs at compile time, so an op the target cannot run fails
there, not when the program is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.fx import GraphModule, Node

from exirc.backend.delegation.lowered import DelegateWithOuts, LoweredDelegate
from exirc.backend.llama_ops import bound_kernel
from exirc.backend.ops import registered_kernel_names
from exirc.errors import OperatorNotSupportedError, UnsupportedOperatorError
from exirc.ir.source import source_location
from exirc.plan.ops import out_variant
from exirc.targets import BACKEND_OPS, builtin_targets, kernel_list, kernel_sets


def kernels_for_target(target: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The operators `target` has kernels for, plus `extra` (more operator names)."""
    names: set[str] = set(extra)
    for kernel_set in kernel_sets(target):
        names |= registered_kernel_names() if kernel_set == BACKEND_OPS \
            else kernel_list(kernel_set)
    return frozenset(names)


def kernel_name(op: Any) -> str | None:
    """`aten::add.out` for an operator (an OpOverload or a backend op); None for a
    call target that is no kernel call (getitem, control flow, Python functions,
    delegate calls, which their backend runs)."""
    if isinstance(op, (LoweredDelegate, DelegateWithOuts)):
        return None
    schema = getattr(op, "_schema", None)
    if not isinstance(schema, torch._C.FunctionSchema):
        return None
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def _calls(graph_module: GraphModule) -> Iterator[Node]:
    for module in graph_module.modules():  # the graph and the subgraphs of control flow
        if isinstance(module, GraphModule):
            yield from (n for n in module.graph.nodes if n.op == "call_function")


def _missing_kernel(op: Any, available: frozenset[str]) -> str | None:
    """Why `op` cannot run on the target, or None if it can.

    A functional op (as in Edge graphs) runs as its out-variant, so that one
    needs the kernel."""
    name = kernel_name(op)
    if name is None or name in available:
        return None
    if not isinstance(op, torch._ops.OpOverload):
        return "no kernel"
    out = out_variant(op)
    if out is None:
        return "no out-variant"
    if out is op:
        return "no kernel"
    out_name = kernel_name(out)
    return None if out_name in available else f"no kernel for {out_name}"


def needed_kernel(op: Any) -> str | None:
    """The kernel a program needs for the Edge op `op`: its out-variant's (or
    for a custom op without one, its own); None if it has no out form."""
    bound = bound_kernel(op)  # a stand-in for an op of ExecuTorch's
    if bound is not None:
        return bound
    out = out_variant(op)
    return None if out is None else kernel_name(out)


def _use(node: Node) -> str:
    """`model.py:4: y = f(x) [%f, module 'block.act' (Act)]`, for messages."""
    where = source_location(node)
    about = f"%{node.name}"
    stack = node.meta.get("nn_module_stack")
    if stack:
        path, kind = list(stack.values())[-1]
        name = kind.__name__ if isinstance(kind, type) else str(kind).rsplit(".", 1)[-1]
        if path:
            about += f", module {path!r} ({name})"
    return f"{where} [{about}]" if where else about


def check_kept_operators(graph_module: GraphModule, target: str,
                         extra: Iterable[str] = ()) -> frozenset[Any]:
    """The ops of an Edge graph outside the Edge op set (`outside_op_set`: custom
    ops, ATen ops with no decomposition) that `target` or `extra` kernels run.

    Raises OperatorNotSupportedError naming every such op with no kernel, each
    with its uses (source line and module) and what the model's author can do.
    """
    from exirc.edge.ops import is_custom_op, outside_op_set

    available = kernels_for_target(target, extra)
    kept: set[Any] = set()
    missing: dict[Any, list[str]] = {}
    for node in _calls(graph_module):
        op = node.target
        if not outside_op_set(op):
            continue
        needed = needed_kernel(op)
        if needed is not None and needed in available:
            kept.add(op)
        else:
            missing.setdefault(op, []).append(_use(node))
    if not missing:
        return frozenset(kept)
    parts, kernels = [], []
    for op, uses in missing.items():
        name = kernel_name(op)
        needed = needed_kernel(op)
        what = f"custom operator {name}" if is_custom_op(op) else f"operator {name}"
        if needed is None:
            why = "its results are not all tensors, so there is no memory to plan for them"
        elif is_custom_op(op):
            why = (f"no kernel for {needed} is registered (target {target!r} has none of "
                   "its own)")
            kernels.append(needed)
        else:
            why = (f"target {target!r} has no kernel for it ({needed}), and it has no "
                   "decomposition into core ATen ops")
            kernels.append(needed)
        parts.append(f"{what}: {why}; used at {_shorten(uses)}")
    if len(parts) == 1:
        message = parts[0].replace(": ", " is not supported: ", 1)
    else:
        message = f"{len(parts)} operators are not supported: " + "; ".join(parts)
    hint = "change the model to avoid it"
    if kernels:
        hint = (f"register a kernel for {', '.join(kernels)} (exirc.runtime.register_kernel) "
                "in a module you pass with --plugin to both `exirc compile` and `exirc run`, "
                "or change the model to avoid it")
    raise OperatorNotSupportedError(message, hint=hint)


def _shorten(uses: list[str], shown: int = 3) -> str:
    more = len(uses) - shown
    return ", ".join(uses[:shown]) + (f" and {more} more" if more > 0 else "")


def check_kernels(graph_module: GraphModule, target: str, extra: Iterable[str] = ()) -> None:
    """Raise UnsupportedOperatorError naming every op of the graph (and its
    subgraphs) that `target` has no kernel for, with where each is used."""
    available = kernels_for_target(target, extra)
    missing: dict[str, list[str]] = {}  # "aten::foo.out (no kernel)" -> uses
    missing_ops: set[Any] = set()
    for node in _calls(graph_module):
        reason = _missing_kernel(node.target, available)
        if reason is None:
            continue
        where = source_location(node)
        use = f"%{node.name}" + (f" at {where}" if where else "")
        missing.setdefault(f"{kernel_name(node.target)} ({reason})", []).append(use)
        missing_ops.add(node.target)
    if not missing:
        return
    listed = "; ".join(f"{op}: {_shorten(uses)}" for op, uses in missing.items())
    count = f"{len(missing)} op{'s' if len(missing) > 1 else ''}"
    hint = "register a backend op with a kernel for it, or decompose it into supported ops"
    able = [other for other in builtin_targets() if other != target and not any(
        _missing_kernel(op, kernels_for_target(other, extra)) for op in missing_ops)]
    if able:
        hint = f"use --target {' or '.join(able)}, or " + hint
    raise UnsupportedOperatorError(f"target {target!r} cannot run {count}: {listed}", hint=hint)
