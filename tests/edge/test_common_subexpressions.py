"""common_subexpressions: a repeated pure computation is made once, and only
a pure one whose inputs no operator writes in place."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node

from exirc.edge.common_subexpressions import CommonSubexpressions, merge_common_subexpressions
from exirc.edge.to_edge import ToEdge
from exirc.edge.verify import verify_edge
from exirc.edge.views_to_copies import ViewsToCopies
from exirc.ir.control_flow import all_nodes
from exirc.ir.quantize_ops import define_quantize_ops
from exirc.pipelines import BUILTIN_PASSES
from exirc.serialize import program as P
from tests.oracle import requires_executorch, run_with_executorch

aten = torch.ops.aten


def _calls(graph: Graph, target: object) -> int:
    return sum(1 for node in graph.nodes if node.target is target)


def _module_of(build: Callable[[Graph, Node], Any]) -> GraphModule:
    graph = Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    return GraphModule(nn.Module(), graph)


def _merged(module: GraphModule) -> bool:
    changed = merge_common_subexpressions(module)
    module.recompile()
    return changed


def test_positions_made_twice_are_made_once_and_compute_the_same() -> None:
    def build(g: Graph, x: Node) -> object:
        n = g.call_function(aten.sym_size.int, (x, 0))
        first = g.call_function(aten.add.Tensor, (g.call_function(aten.arange.start, (0, n)), x))
        again = g.call_function(aten.add.Tensor, (g.call_function(aten.arange.start, (0, n)), x))
        return (g.call_function(aten.mul.Tensor, (first, again)),)

    module = _module_of(build)
    x = torch.arange(5.0)
    expected = module(x)
    assert _merged(module)
    assert _calls(module.graph, aten.arange.start) == 1
    assert _calls(module.graph, aten.add.Tensor) == 1
    torch.testing.assert_close(module(x), expected)


def _assert_read_twice(build: Callable[[Graph, Node], object], op: object,
                       expected: torch.Tensor) -> None:
    """`build`'s two calls of `op` around an in-place write both stay, and the
    graph on zeros gives `expected`."""
    module = _module_of(build)
    assert not _merged(module)
    assert _calls(module.graph, op) == 2
    torch.testing.assert_close(module(torch.zeros(3))[0], expected)


def test_a_value_written_in_place_is_read_again_after_the_write() -> None:
    def build(g: Graph, x: Node) -> object:
        before = g.call_function(aten.mul.Tensor, (x, 2))
        g.call_function(aten.add_.Tensor, (x, 1))
        after = g.call_function(aten.mul.Tensor, (x, 2))
        return (g.call_function(aten.sub.Tensor, (after, before)),)

    _assert_read_twice(build, aten.mul.Tensor, torch.full((3,), 2.0))


def test_a_view_of_a_value_written_in_place_is_read_again_after_the_write() -> None:
    def build(g: Graph, x: Node) -> object:
        view = g.call_function(aten.view.default, (x, [3]))
        before = g.call_function(aten.mul.Tensor, (view, 2))
        g.call_function(aten.add_.Tensor, (x, 1))
        after = g.call_function(aten.mul.Tensor, (view, 2))
        return (g.call_function(aten.sub.Tensor, (after, before)),)

    _assert_read_twice(build, aten.mul.Tensor, torch.full((3,), 2.0))


def test_a_value_written_through_a_view_is_read_again_after_the_write() -> None:
    def build(g: Graph, x: Node) -> object:
        before = g.call_function(aten.neg.default, (x,))
        view = g.call_function(aten.view.default, (x, [3]))
        g.call_function(aten.add_.Tensor, (view, 1))
        after = g.call_function(aten.neg.default, (x,))
        return (g.call_function(aten.sub.Tensor, (before, after)),)

    _assert_read_twice(build, aten.neg.default, torch.ones(3))


def test_results_each_written_in_place_stay_two_buffers() -> None:
    def build(g: Graph, x: Node) -> object:
        caches = [g.call_function(aten.zeros.default, ([3],)) for _ in range(2)]
        g.call_function(aten.add_.Tensor, (caches[0], x))
        g.call_function(aten.add_.Tensor, (caches[1], x))
        return (g.call_function(aten.add.Tensor, (caches[0], caches[1])),)

    module = _module_of(build)
    assert not _merged(module)
    assert _calls(module.graph, aten.zeros.default) == 2
    torch.testing.assert_close(module(torch.ones(3))[0], torch.full((3,), 2.0))


def test_random_calls_outputs_and_signed_zeros_stay_apart() -> None:
    def build(g: Graph, x: Node) -> object:
        noise = [g.call_function(aten.rand_like.default, (x,)) for _ in range(2)]
        zeros = [g.call_function(aten.add.Tensor, (x, zero)) for zero in (0.0, -0.0)]
        returned = [g.call_function(aten.neg.default, (x,)) for _ in range(2)]
        return (*noise, g.call_function(aten.div.Tensor, (zeros[0], zeros[1])), *returned)

    module = _module_of(build)
    assert not _merged(module)
    assert _calls(module.graph, aten.rand_like.default) == 2
    assert _calls(module.graph, aten.add.Tensor) == 2
    assert _calls(module.graph, aten.neg.default) == 2


def test_undefined_contents_data_dependent_sizes_dequantizes_and_reshapes_stay_apart() -> None:
    quantized = define_quantize_ops()

    def build(g: Graph, x: Node) -> object:
        empty = [g.call_function(aten.empty.memory_format, ([3],)) for _ in range(2)]
        item = [g.call_function(aten._local_scalar_dense.default, (x,)) for _ in range(2)]
        nonzero = [g.call_function(aten.nonzero.default, (x,)) for _ in range(2)]
        dq = [g.call_function(quantized.dequantize_per_tensor.default,
                              (x, 0.5, 0, -128, 127, torch.int8)) for _ in range(2)]
        reshapes = [g.call_function(aten.view_copy.default, (x, [3])) for _ in range(2)]
        return [g.call_function(operator.add, tuple(pair)) if pair is item else
                g.call_function(aten.add.Tensor, tuple(pair))
                for pair in (empty, nonzero, dq, reshapes)]

    module = _module_of(build)
    assert not _merged(module)
    assert _calls(module.graph, aten.empty.memory_format) == 2
    assert _calls(module.graph, aten._local_scalar_dense.default) == 2
    assert _calls(module.graph, aten.nonzero.default) == 2
    assert _calls(module.graph, quantized.dequantize_per_tensor.default) == 2
    assert _calls(module.graph, aten.view_copy.default) == 2


def test_equal_numbers_of_other_types_stay_apart() -> None:
    def build(g: Graph, x: Node) -> object:
        as_int = g.call_function(aten.mul.Tensor, (x, 1))
        as_float = g.call_function(aten.mul.Tensor, (x, 1.0))
        return (g.call_function(aten.add.Tensor, (as_int, as_float)),)

    assert not _merged(_module_of(build))


def test_a_value_passed_by_keyword_by_position_or_by_default_is_one_call() -> None:
    def build(g: Graph, x: Node) -> object:
        sums = [g.call_function(aten.sum.dim_IntList, (x, [0])),
                g.call_function(aten.sum.dim_IntList, (x, [0], False)),
                g.call_function(aten.sum.dim_IntList, (x, (0,)), {"keepdim": False}),
                g.call_function(aten.sum.dim_IntList, (x, [0], True))]
        return (g.call_function(aten.stack.default, (sums[:3],)), sums[3])

    module = _module_of(build)
    x = torch.arange(6.0).reshape(2, 3)
    expected = module(x)
    assert _merged(module)
    assert _calls(module.graph, aten.sum.dim_IntList) == 2  # keepdim=True is another sum
    torch.testing.assert_close(module(x), expected)


def test_a_result_with_two_elements_merges_whole_unless_an_element_is_returned() -> None:
    def build(g: Graph, x: Node) -> object:
        maxima = [g.call_function(aten.max.dim, (x, 1)) for _ in range(4)]
        values = [g.call_function(operator.getitem, (m, 0)) for m in maxima]
        indices = [g.call_function(operator.getitem, (m, 1)) for m in maxima]
        inside = g.call_function(aten.add.Tensor, (values[0], values[1]))
        as_float = g.call_function(aten.mul.Tensor, (indices[0], indices[1]))
        return (inside, as_float, values[2], values[3])  # the last two: two outputs

    module = _module_of(build)
    x = torch.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    expected = module(x)
    assert _merged(module)
    assert _calls(module.graph, aten.max.dim) == 3
    assert _calls(module.graph, operator.getitem) == 6  # 2 of the merged, 2 each returned
    got = module(x)
    torch.testing.assert_close(got, expected)


class _Branches(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def yes(x: torch.Tensor) -> torch.Tensor:
            return x.sin() * x.sin()

        def no(x: torch.Tensor) -> torch.Tensor:
            return x.cos() + x.cos()

        return torch.cond(x.sum() > 0, yes, no, (x,)) + x.exp() * x.exp()


def test_repeated_calls_in_control_flow_subgraphs_are_made_once() -> None:
    program = torch.export.export(_Branches().eval(), (torch.ones(3),), strict=False)
    for edge_pass in (ToEdge(), ViewsToCopies()):
        program = edge_pass.run(program).program
    result = CommonSubexpressions().run(program)
    assert result.changed
    verify_edge(result.program)
    targets = [n.target for n in all_nodes(result.program.graph_module)]
    assert (targets.count(aten.sin.default), targets.count(aten.cos.default),
            targets.count(aten.exp.default)) == (1, 1, 1)
    module = result.program.module()
    for x in (torch.linspace(-1, 2, 3), -torch.ones(3)):
        torch.testing.assert_close(module(x), _Branches()(x))


def test_operands_of_control_flow_whose_subgraph_writes_them_are_read_again() -> None:
    def writes(g: Graph, x: Node) -> object:
        return (g.call_function(aten.add_.Tensor, (x, 1)),)

    root = nn.Module()
    root.yes, root.no = _module_of(writes), _module_of(writes)
    graph = Graph()
    x = graph.placeholder("x")
    before = graph.call_function(aten.mul.Tensor, (x, 2))
    pred = graph.call_function(aten.gt.Scalar, (graph.call_function(aten.sum.default, (x,)), 0))
    branches = (graph.get_attr("yes"), graph.get_attr("no"))
    graph.call_function(torch.ops.higher_order.cond, (pred, *branches, (x,)))
    after = graph.call_function(aten.mul.Tensor, (x, 2))
    graph.output((graph.call_function(aten.sub.Tensor, (after, before)),))
    assert not _merged(GraphModule(root, graph))
    assert _calls(graph, aten.mul.Tensor) == 2


class _Layers(nn.Module):
    """Each layer makes the positions (`arange(n) + start`) again, as transformers'
    decoders do; the start is a size, so nothing of it folds at compile time."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def forward(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            positions = torch.arange(x.shape[0]) + start.shape[0]
            x = layer(x) * positions.unsqueeze(1)
        return x


@requires_executorch
@pytest.mark.oracle
@pytest.mark.parametrize("target", ["portable", "xnnpack"])
def test_a_decoders_positions_are_made_once_and_run_like_eager(target: str) -> None:
    from exirc.compiler import CompileOptions, compile_module
    from exirc.runtime import load

    model = _Layers().eval()
    inputs = (torch.randn(5, 4), torch.zeros(3))
    shapes = ({0: torch.export.Dim("n", max=16)}, {0: torch.export.Dim("start", max=64)})
    result = compile_module(model, inputs, dynamic_shapes=shapes,
                            options=CompileOptions(target=target))
    plan = result.program.execution_plan[0]
    called = [plan.operators[i.op_index].name for chain in plan.chains
              for i in chain.instructions if isinstance(i, P.KernelCall)]
    assert called.count("aten::arange") == 1, called
    for x, start in ((torch.randn(7, 4), torch.zeros(2)), inputs):
        with torch.no_grad():
            want = model(x, start)
        torch.testing.assert_close(load(result.data).method("forward").run([x, start])[0], want)
        torch.testing.assert_close(run_with_executorch(result.data, (x, start))[0], want)


def test_the_pass_is_registered_under_its_pipeline_name() -> None:
    assert (BUILTIN_PASSES["common_subexpressions"].__doc__ or "").startswith("Edge -> Edge")
