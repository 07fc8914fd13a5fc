"""Finding and dropping a graph's constant weights: what the weight-only and the
dynamic-activation modes (exirc.quantize.weight_only, .dynamic) both need to
rewrite an exported model's matmuls and embeddings before it is exported again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

_aten = torch.ops.aten


def weight_use(model: GraphModule, node: Node) -> tuple[int, bool] | None:
    """(argument index, whether stored transposed) of a constant 2-D float weight
    that `node` reads as an embedding table or a matmul's right side."""
    if node.op != "call_function":
        return None
    if node.target == _aten.embedding.default:
        index, transposed = 0, False
    elif node.target == _aten.linear.default:
        index, transposed = 1, False
    elif node.target == _aten.addmm.default:
        index, transposed = 2, True  # [in, out]: groups run along `in`, a column
    elif node.target == _aten.mm.default:
        index, transposed = 1, True
    else:
        return None
    if len(node.args) <= index:
        return None
    weight = node.args[index]
    if not isinstance(weight, Node) or weight.op != "get_attr":
        return None
    value = attribute_at(model, str(weight.target))
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32 or value.dim() != 2:
        return None
    return index, transposed


def attribute_at(model: GraphModule, target: str) -> Any:
    """The attribute a `get_attr` node names (dotted), or None."""
    owner: Any = model
    for part in target.split("."):
        owner = getattr(owner, part, None)
    return owner


def first_node(graph: torch.fx.Graph) -> Node:
    """Where new nodes go: before the first that is not an input."""
    return next(n for n in graph.nodes if n.op != "placeholder")


def drop_unused_attributes(model: GraphModule) -> None:
    """Float weights no node reads any more: deleted, so they are not exported."""
    used = {str(n.target) for n in model.graph.nodes if n.op == "get_attr"}
    for name, _ in list(model.named_parameters()) + list(model.named_buffers()):
        if name in used:
            continue
        owner_name, _, attribute = name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        if attribute in owner._parameters:
            del owner._parameters[attribute]
        elif attribute in owner._buffers:
            del owner._buffers[attribute]


@dataclass(frozen=True)
class WeightRead:
    """`node` reads the constant `weight` as its argument `index` (transposed: an
    `addmm`/`mm` right side, stored [in, out])."""

    node: Node
    index: int
    weight: Node
    transposed: bool

    @property
    def key(self) -> tuple[str, bool]:
        """One quantized copy per weight and orientation, however many nodes read it."""
        return str(self.weight.target), self.transposed

    def stored_shape(self, model: GraphModule) -> tuple[int, ...]:
        return tuple(attribute_at(model, str(self.weight.target)).shape)

    def rows(self, model: GraphModule) -> torch.Tensor:
        """The weight as [out, in] rows, the axis its groups run along last."""
        weight = attribute_at(model, str(self.weight.target))
        return weight.t() if self.transposed else weight


def weight_reads(model: GraphModule, keep: Callable[[Node], bool]) -> Iterator[WeightRead]:
    """Each node `keep` accepts that reads a constant weight (`weight_use`), in graph
    order; the graph may be edited between reads."""
    for node in list(model.graph.nodes):
        if not keep(node):
            continue
        found = weight_use(model, node)
        if found is None:
            continue
        weight = node.args[found[0]]
        assert isinstance(weight, Node)
        yield WeightRead(node, found[0], weight, found[1])
