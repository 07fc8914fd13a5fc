"""The node-rewriting driver every node-by-node pass runs on.

A rule answers per node: None (keep), the node (changed in place), another
node (use it instead) or ERASE. The driver applies that in every graph,
subgraphs of control flow included, recompiles what changed and reports
whether anything did.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._higher_order_ops.while_loop import while_loop
from torch.export import ExportedProgram
from torch.fx import Graph, GraphModule, Node

from exirc.ir.control_flow import all_nodes, graph_modules
from exirc.ir.rewrite import ERASE, Answer, rewrite_nodes

aten = torch.ops.aten


def export(module: torch.nn.Module, *inputs: torch.Tensor) -> ExportedProgram:
    return torch.export.export(module.eval(), inputs, strict=False)


def targets(root: GraphModule) -> list[Any]:
    return [n.target for n in all_nodes(root) if n.op == "call_function"]


def relu_to_clamp(node: Node) -> Answer:
    """relu(x) -> clamp_min(x, 0.0): same values, another op."""
    if node.target is not aten.relu.default:
        return None
    node.target = aten.clamp_min.default
    node.args = (node.args[0], 0.0)
    return node


def assert_runs_like(root: GraphModule, model: torch.nn.Module, *inputs: torch.Tensor) -> None:
    """`root`'s own generated code (no copy of it) gives eager's result."""
    got, expected = root(*inputs), model(*inputs)
    torch.testing.assert_close(tuple(got) if isinstance(got, (tuple, list)) else (got,),
                               expected if isinstance(expected, tuple) else (expected,))


class Toy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.clone() + 1).relu() * 2


class Branches(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: (x - 1).relu(), lambda x: (x + 1).relu(), (x,))


class Loop(torch.nn.Module):
    def forward(self, i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def more(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return i < 3

        def step(i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, (x - 0.5).relu()

        return while_loop(more, step, (i, x))  # type: ignore[no-any-return]


def test_a_rule_changing_nodes_in_place_rewrites_the_graph_and_its_code() -> None:
    model, x = Toy(), torch.randn(3, 4)
    program = export(model, x)
    root = program.graph_module

    assert rewrite_nodes(root, relu_to_clamp) is True

    assert aten.relu.default not in targets(root)
    assert aten.clamp_min.default in targets(root)
    assert "aten.clamp_min" in root.code and "aten.relu" not in root.code  # recompiled
    assert_runs_like(root, model, x)


def test_a_replacement_node_takes_over_the_uses_and_the_node_goes() -> None:
    model, x = Toy(), torch.randn(3, 4)
    root = export(model, x).graph_module

    def drop_clone(node: Node) -> Answer:
        return node.args[0] if node.target is aten.clone.default else None  # type: ignore[return-value]

    assert rewrite_nodes(root, drop_clone) is True

    assert aten.clone.default not in targets(root)
    assert "aten.clone" not in root.code
    assert_runs_like(root, model, x)


def _graph_with_dead_work() -> GraphModule:
    """x -> neg -> sin (unused) and x -> cos -> output."""
    graph = Graph()
    x = graph.placeholder("x")
    sin = graph.call_function(aten.sin.default, (graph.call_function(aten.neg.default, (x,)),))
    graph.output(graph.call_function(aten.cos.default, (x,)))
    assert not sin.users
    return GraphModule(torch.nn.Module(), graph)


def test_erase_drops_the_node_and_what_became_dead_when_asked() -> None:
    def erase_sin(node: Node) -> Answer:
        return ERASE if node.target is aten.sin.default else None

    kept = _graph_with_dead_work()
    assert rewrite_nodes(kept, erase_sin) is True
    assert targets(kept) == [aten.neg.default, aten.cos.default]

    cleaned = _graph_with_dead_work()
    assert rewrite_nodes(cleaned, erase_sin, eliminate_dead_code=True) is True
    assert targets(cleaned) == [aten.cos.default]
    x = torch.randn(5)
    torch.testing.assert_close(cleaned(x), x.cos())


def test_nothing_changed_is_reported_and_the_graph_left_alone() -> None:
    module = _graph_with_dead_work()
    code = module.code
    seen: list[Any] = []

    def look(node: Node) -> Answer:
        seen.append(node.target)
        return None

    assert rewrite_nodes(module, look, eliminate_dead_code=True) is False
    assert seen == [aten.neg.default, aten.sin.default, aten.cos.default]  # call_functions only
    assert targets(module) == seen  # the dead neg -> sin stays: no graph changed
    assert module.code == code


def test_the_branches_of_cond_are_rewritten_and_recompiled() -> None:
    model, x = Branches(), torch.randn(3, 4)
    root = export(model, x).graph_module
    assert aten.relu.default not in [n.target for n in root.graph.nodes]  # only in branches

    assert rewrite_nodes(root, relu_to_clamp) is True

    branches = list(graph_modules(root))[1:]
    assert len(branches) == 2
    for branch in branches:
        assert "aten.clamp_min" in branch.code and "aten.relu" not in branch.code
    assert aten.relu.default not in targets(root)
    assert_runs_like(root, model, x)
    assert_runs_like(root, model, -x)


def test_the_body_of_while_loop_is_rewritten_and_recompiled() -> None:
    model, inputs = Loop(), (torch.tensor(0), torch.randn(3, 4))
    root = export(model, *inputs).graph_module

    assert rewrite_nodes(root, relu_to_clamp) is True

    cond_graph, body_graph = list(graph_modules(root))[1:]
    assert "aten.clamp_min" in body_graph.code and "aten.relu" not in body_graph.code
    assert aten.clamp_min.default not in targets(cond_graph)
    assert aten.relu.default not in targets(root)
    assert_runs_like(root, model, *inputs)
