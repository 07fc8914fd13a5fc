"""remake_shared_views: a reshape one partition only hands on is remade where it is read."""

from __future__ import annotations

import torch
from torch.fx import Graph, Node

from exirc.backend.delegation.interface import Partition
from exirc.backend.delegation.shared_views import remake_shared_views

aten = torch.ops.aten


def _graph() -> tuple[Graph, dict[str, Node]]:
    """x -> view (and a P1 add reading it), a sum on the interpreter, then a P2
    multiply and a P3 (other backend) multiply of the view."""
    graph = Graph()
    x = graph.placeholder("x")
    view = graph.call_function(aten.unsqueeze_copy.default, (x, 1))
    first = graph.call_function(aten.add.Tensor, (view, 1.0))
    total = graph.call_function(aten.sum.default, (first,))
    second = graph.call_function(aten.mul.Tensor, (view, total))
    third = graph.call_function(aten.mul.Tensor, (view, total))
    graph.output((second, third))
    return graph, {"view": view, "first": first, "second": second, "third": third}


def test_a_view_read_by_another_partition_is_remade_there() -> None:
    graph, n = _graph()
    p1 = Partition("Toy", [n["view"], n["first"]])
    p2 = Partition("Toy", [n["second"]])
    p3 = Partition("Other", [n["third"]])
    partitions = [p1, p2, p3]
    assert remake_shared_views(partitions) == 1
    (copy,) = [node for node in p2.nodes if node is not n["second"]]
    assert copy.target is aten.unsqueeze_copy.default and copy.args == n["view"].args
    assert n["second"].args[0] is copy and p2.nodes == [copy, n["second"]]
    # The first partition keeps its own reader's view; another backend's reader
    # keeps reading it (a backend takes only its own kind of node).
    assert p1.nodes == [n["view"], n["first"]] and n["third"].args[0] is n["view"]
    graph.lint()


def test_a_partition_that_only_handed_the_view_on_is_gone() -> None:
    graph, n = _graph()
    partitions = [Partition("Toy", [n["view"]]), Partition("Toy", [n["first"], n["second"]]),
                  Partition("Other", [n["third"]])]
    assert remake_shared_views(partitions) == 1
    # The view is still read outside (by `third`, another backend's): it stays,
    # as that partition's output, so nothing is erased.
    assert [len(p.nodes) for p in partitions] == [1, 3, 1]
    graph.lint()
    # With every reader in one other partition, the first has nothing left.
    graph, m = _graph()
    again = [Partition("Toy", [m["view"]]),
             Partition("Toy", [m["first"], m["second"], m["third"]])]
    assert remake_shared_views(again) == 1
    assert len(again) == 1 and m["view"] not in graph.nodes
    assert all(node.args[0].target is aten.unsqueeze_copy.default
               for node in (m["first"], m["second"], m["third"]))
    graph.lint()
