"""The reference of localizing: the planned graph, run by torch.

`record_planned` runs the memory-planned graph the program was emitted from
node by node with torch's own kernels (`torch.fx.Interpreter`), recording
every node's value, once per execution for nodes in loop bodies and
branches. `exirc.diagnostics.localize` compares each instruction's result
with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.export.graph_signature import InputKind
from torch.fx import GraphModule, Interpreter, Node

from exirc.diagnostics.divergence import LocalizeError, describe_failure
from exirc.plan.ops import OUT_FORM_OPS, is_alloc

if TYPE_CHECKING:
    from torch.export import ExportedProgram

Recorded = dict[Node, list[Any]]


def record_planned(planned: ExportedProgram, inputs: Sequence[torch.Tensor]) -> Recorded:
    """Each node's values (one per execution) when torch runs the planned graph."""
    module = planned.graph_module
    args = _placeholder_values(planned, inputs)
    sizes = _bind_sizes(module, args)
    values: Recorded = {}
    with torch.no_grad():
        _Recorder(module, values, sizes).run(*args)
    return values


def _placeholder_values(planned: ExportedProgram, inputs: Sequence[torch.Tensor]) -> list[Any]:
    user = iter(inputs)
    values = []
    for spec in planned.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(next(user))
        elif spec.target in planned.constants:
            values.append(planned.constants[spec.target])
        else:
            values.append(planned.state_dict[str(spec.target)])
    return values


def _bind_sizes(module: GraphModule, args: Sequence[Any]) -> dict[Any, int]:
    """Symbol -> size, from the inputs' actual shapes (for allocs of symbolic shape)."""
    import sympy

    sizes: dict[Any, int] = {}
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, args):
        fake = node.meta.get("val")
        if not isinstance(fake, torch.Tensor) or not isinstance(value, torch.Tensor):
            continue
        for dim, size in zip(fake.shape, value.shape):
            if isinstance(dim, torch.SymInt) and isinstance(dim.node.expr, sympy.Symbol):
                sizes[dim.node.expr] = int(size)
    return sizes


class _Recorder(Interpreter):
    """Runs a planned graph (or a subgraph of it) and records node values.

    `alloc` nodes get memory of the actual sizes; control-flow nodes run their
    subgraphs through recorders too, so nodes inside branches and loop bodies
    are recorded on every execution.
    """

    def __init__(self, module: GraphModule, values: Recorded, sizes: dict[Any, int]) -> None:
        super().__init__(module)
        self.values = values
        self.sizes = sizes

    def run_node(self, n: Node) -> Any:
        if is_alloc(n):
            fake = n.meta["val"]
            return torch.empty([self._size(d) for d in fake.shape], dtype=fake.dtype)
        try:
            value = super().run_node(n)
        except LocalizeError:
            raise  # from a node of a subgraph, already named
        except Exception as error:
            target = str(n.target) if isinstance(n.target, (str, torch._ops.OpOverload)) \
                else getattr(n.target, "__name__", str(n.target))
            raise LocalizeError(f"torch cannot run node %{n.name} ({target}) of the "
                                f"planned graph: {describe_failure(error)}") from error
        if n.op == "call_function":
            self.values.setdefault(n, []).append(value)
        return value

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if target in OUT_FORM_OPS:
            args = tuple(self._recording(a) if isinstance(a, GraphModule) else a for a in args)
        elif isinstance(target, torch._ops.OpOverload):
            kwargs = _schema_kwargs(target, kwargs)
        return super().call_function(target, args, kwargs)

    def _recording(self, module: GraphModule) -> Callable[..., Any]:
        def run(*operands: Any) -> Any:
            return _Recorder(module, self.values, self.sizes).run(*operands)
        return run

    def _size(self, dim: Any) -> int:
        if not isinstance(dim, torch.SymInt):
            return int(dim)
        try:
            return int(dim.node.expr.xreplace(self.sizes))
        except (TypeError, ValueError):
            return 0  # a size known only at run time: the out= kernel resizes it


def _schema_kwargs(target: torch._ops.OpOverload, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` without those `target`'s schema does not take.

    An out-variant node keeps the tensor options of the functional call it
    was made from (`arange(..., dtype=f32, layout=..., out=%alloc)`,
    `_to_copy(x, dtype=f16, out=%alloc)`): the out tensor decides them, so the
    out overload takes none, and the emitter leaves them out too.
    """
    names = {argument.name for argument in target._schema.arguments}
    if all(name in names for name in kwargs):
        return kwargs
    return {name: value for name, value in kwargs.items() if name in names}

