"""Memory planning: lifetimes of out-variant graphs, the planner, its checker, the pass."""

from __future__ import annotations

import importlib
import operator
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Graph, Node

from exirc.errors import InternalError, ModelError, UsageError
from exirc.ir.meta import memory_plan, planned_memory
from exirc.plan.lifetimes import Lifetime, tensor_lifetimes
from exirc.plan.memory_plan import MemoryPlanPass
from exirc.plan.ops import alloc, is_alloc
from exirc.plan.placement import (
    ALGORITHMS,
    MemoryPlan,
    check_plan,
    lowest_gap,
    peak_live_bytes,
    plan_memory,
)
from tests.oracle import MODELS, requires_executorch

aten = torch.ops.aten

# --------------------------------------------------------------------------
# Hand-built out-variant graphs.
# --------------------------------------------------------------------------


def _tensor(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def _placeholder(graph: Graph, name: str, shape: Sequence[int]) -> Node:
    node = graph.placeholder(name)
    node.meta["val"] = _tensor(shape)
    return node


def _alloc(graph: Graph, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> Node:
    node = graph.call_function(alloc, ((tuple(shape), dtype),))
    node.meta["val"] = _tensor(shape, dtype)
    return node


def _spans(lifetimes: list[Lifetime]) -> dict[str, tuple[int, int, int]]:
    return {lt.node.name: (lt.nbytes, lt.start, lt.end) for lt in lifetimes}


@pytest.mark.smoke
def test_chain_of_out_variant_ops() -> None:
    g = Graph()
    x = _placeholder(g, "x", [2, 3])  # 0
    w = _placeholder(g, "w", [2, 3])  # 1: a parameter, not planned
    a0 = _alloc(g, [2, 3])  # 2
    add = g.call_function(aten.add.out, (x, w), {"out": a0})  # 3
    a1 = _alloc(g, [2, 3])  # 4
    relu = g.call_function(aten.relu.out, (add,), {"out": a1})  # 5
    g.output((relu,))  # 6

    lifetimes = tensor_lifetimes(g, {"x"})

    assert _spans(lifetimes) == {"x": (24, 0, 3), "alloc": (24, 2, 5), "alloc_1": (24, 4, 6)}
    assert [lt.node for lt in lifetimes] == [x, a0, a1]
    assert is_alloc(a0) and not is_alloc(add) and not is_alloc(x)


def test_user_inputs_live_from_the_start() -> None:
    g = Graph()
    w = _placeholder(g, "w", [4])  # 0
    y = _placeholder(g, "y", [4])  # 1
    a = _alloc(g, [4])  # 2
    g.call_function(aten.mul.out, (w, y), {"out": a})  # 3
    g.output((a,))  # 4
    assert _spans(tensor_lifetimes(g, {"y"})) == {"y": (16, 0, 3), "alloc": (16, 2, 4)}


def test_multi_output_op_and_getitem_alias_each_out() -> None:
    g = Graph()
    x = _placeholder(g, "x", [4, 5])  # 0
    values = _alloc(g, [4])  # 1
    indices = _alloc(g, [4], torch.int64)  # 2
    top = g.call_function(aten.max.dim_max, (x, 1), {"max": values, "max_values": indices})  # 3
    v = g.call_function(operator.getitem, (top, 0))  # 4
    i = g.call_function(operator.getitem, (top, 1))  # 5
    a = _alloc(g, [4])  # 6
    neg = g.call_function(aten.neg.out, (v,), {"out": a})  # 7
    g.call_function(aten.sym_size.int, (x, 0))  # 8: not a tensor, uses x
    g.output((neg, i))  # 9

    spans = _spans(tensor_lifetimes(g, {"x"}))

    assert spans == {
        "x": (80, 0, 8),
        "alloc": (16, 1, 7),  # values: last used through getitem %v by neg
        "alloc_1": (32, 2, 9),  # indices: returned through getitem %i
        "alloc_2": (16, 6, 9),
    }


def test_tensor_list_out_and_getitem() -> None:
    g = Graph()
    x = _placeholder(g, "x", [4, 2])  # 0
    first, second = _alloc(g, [2, 2]), _alloc(g, [2, 2])  # 1, 2
    split = g.call_function(aten.split_copy.Tensor_out, (x, 2), {"out": [first, second]})  # 3
    g.call_function(operator.getitem, (split, 0))  # 4: unused
    late = g.call_function(operator.getitem, (split, 1))  # 5
    a = _alloc(g, [2, 2])  # 6
    relu = g.call_function(aten.relu.out, (late,), {"out": a})  # 7
    g.output((relu,))  # 8
    spans = _spans(tensor_lifetimes(g, {"x"}))
    assert spans["alloc"][1:] == (1, 5)  # ends at the getitems, its last readers
    assert spans["alloc_1"][1:] == (2, 7)


def test_views_and_in_place_ops_alias_their_base() -> None:
    g = Graph()
    x = _placeholder(g, "x", [2, 3])  # 0
    a = _alloc(g, [2, 3])  # 1
    relu = g.call_function(aten.relu.out, (x,), {"out": a})  # 2
    flat = g.call_function(aten.view.default, (relu, [6]))  # 3
    g.call_function(aten.add_.Tensor, (flat, 1.0))  # 4: in place on the view
    b = _alloc(g, [6])  # 5
    neg = g.call_function(aten.neg.out, (flat,), {"out": b})  # 6
    g.output((neg,))  # 7

    with_views = _spans(tensor_lifetimes(g, {"x"}, view_ops={aten.view.default}))
    assert with_views["alloc"] == (24, 1, 6)
    # Without knowing the view aliases, the alloc dies at the view: wrong, hence the parameter.
    assert _spans(tensor_lifetimes(g, {"x"}))["alloc"] == (24, 1, 3)


def test_number_inputs_are_not_planned() -> None:
    g = Graph()
    x = _placeholder(g, "x", [4])
    n = g.placeholder("n")
    n.meta["val"] = 3
    a = _alloc(g, [4])
    g.call_function(aten.mul.out, (x, n), {"out": a})
    g.output((a,))
    assert [lt.node for lt in tensor_lifetimes(g, {"x", "n"})] == [x, a]


def test_missing_tensor_metadata_is_an_internal_error() -> None:
    g = Graph()
    x = g.placeholder("x")
    g.output((x,))
    with pytest.raises(InternalError, match=r"%x has no tensor in meta\['val'\]"):
        tensor_lifetimes(g, {"x"})


# --------------------------------------------------------------------------
# Symbolic shapes: sizes at the upper bound of each dynamic dimension.
# --------------------------------------------------------------------------


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _export_affine(batch: Any) -> ExportedProgram:
    return torch.export.export(
        Affine(), (torch.randn(3, 4),), dynamic_shapes=({0: batch},), strict=False
    )


def test_dynamic_dims_use_their_upper_bound() -> None:
    program = out_variant_program(_export_affine(torch.export.Dim("batch", max=8)))
    lifetimes = tensor_lifetimes(program.graph_module.graph, _user_inputs(program))
    by_name = {lt.node.name: lt.nbytes for lt in lifetimes}
    assert by_name["x"] == 8 * 4 * 4
    assert sorted(by_name.values()) == [64, 128, 128, 128]  # permute_copy 4x4; x, addmm, relu

    small = tensor_lifetimes(
        program.graph_module.graph, _user_inputs(program), size_bound=lambda dim: 2
    )
    assert {lt.node.name: lt.nbytes for lt in small}["x"] == 2 * 4 * 4


def test_unbounded_dynamic_dim_tells_how_to_bound_it() -> None:
    program = out_variant_program(_export_affine(torch.export.Dim("batch")))
    with pytest.raises(ModelError) as caught:
        tensor_lifetimes(program.graph_module.graph, _user_inputs(program))
    message = str(caught.value)
    assert "%x" in message and "no upper bound" in message
    assert "torch.export.Dim(" in message and "max=N" in message


# --------------------------------------------------------------------------
# The planner, on lifetimes whose best plan is known by hand.
# --------------------------------------------------------------------------


def _lifetimes(*specs: tuple[str, int, int, int]) -> list[Lifetime]:
    """Lifetimes of (name, nbytes, start, end), each on its own placeholder."""
    g = Graph()
    return [Lifetime(g.placeholder(name), n, start, end) for name, n, start, end in specs]


def _offsets(plan: MemoryPlan) -> dict[str, int]:
    return {node.name: offset for node, offset in plan.offsets.items()}


@pytest.mark.smoke
def test_greedy_reuses_memory_of_dead_tensors() -> None:
    # a and c never live together, so c takes a's bytes; b overlaps both.
    lifetimes = _lifetimes(("a", 64, 0, 2), ("b", 32, 1, 3), ("c", 64, 3, 4))
    plan = plan_memory(lifetimes)
    assert _offsets(plan) == {"a": 0, "c": 0, "b": 64}
    assert (plan.arena_bytes, plan.lower_bound) == (96, 96)
    check_plan(lifetimes, plan)

    naive = plan_memory(lifetimes, algorithm="naive")
    assert _offsets(naive) == {"a": 0, "b": 64, "c": 96}
    assert (naive.arena_bytes, naive.lower_bound) == (160, 96)
    check_plan(lifetimes, naive)


def test_greedy_fills_holes_left_by_larger_tensors() -> None:
    # big1 and big2 are placed first at 0 and 64; small overlaps only big2 and
    # fits below it, in the bytes big1 no longer uses.
    lifetimes = _lifetimes(
        ("big1", 64, 0, 1), ("big2", 64, 0, 5), ("mid", 48, 2, 3), ("small", 16, 4, 5)
    )
    plan = plan_memory(lifetimes)
    assert _offsets(plan) == {"big1": 0, "big2": 64, "mid": 0, "small": 0}
    assert (plan.arena_bytes, plan.lower_bound) == (128, 128)


def test_lowest_gap() -> None:
    assert lowest_gap([], 32) == 0
    assert lowest_gap([(0, 16), (48, 64)], 32) == 16
    assert lowest_gap([(0, 16), (32, 64)], 32) == 64
    assert lowest_gap([(0, 64), (16, 32)], 16) == 64  # a range inside another
    assert lowest_gap([(32, 64)], 32) == 0


def test_alignment_rounds_sizes_and_offsets() -> None:
    lifetimes = _lifetimes(("a", 10, 0, 1), ("b", 20, 0, 1))
    assert _offsets(plan_memory(lifetimes)) == {"b": 0, "a": 32}
    assert plan_memory(lifetimes).arena_bytes == 48
    assert plan_memory(lifetimes, alignment=64).arena_bytes == 128
    assert plan_memory(lifetimes, alignment=1).arena_bytes == 30
    assert peak_live_bytes(lifetimes, 16) == 48


def test_empty_and_zero_size_tensors() -> None:
    assert plan_memory([]).arena_bytes == 0
    lifetimes = _lifetimes(("a", 64, 0, 3), ("empty", 0, 1, 2))
    plan = plan_memory(lifetimes)
    assert (plan.arena_bytes, plan.lower_bound) == (64, 64)
    check_plan(lifetimes, plan)


def test_bad_options_are_usage_errors() -> None:
    with pytest.raises(UsageError,
                       match="choose one of greedy_best, greedy_by_size, naive, shared_buffers"):
        plan_memory([], algorithm="best_fit")
    with pytest.raises(UsageError, match="alignment"):
        plan_memory([], alignment=0)


# --------------------------------------------------------------------------
# The checker.
# --------------------------------------------------------------------------


def _plan(lifetimes: list[Lifetime], offsets: list[int], arena: int = 256) -> MemoryPlan:
    by_node = {lt.node: offset for lt, offset in zip(lifetimes, offsets)}
    return MemoryPlan(by_node, arena, peak_live_bytes(lifetimes, 16), 16, "by hand")


@pytest.mark.smoke
def test_checker_names_both_tensors_that_share_live_bytes() -> None:
    lifetimes = _lifetimes(("act", 64, 2, 5), ("grad", 32, 4, 7))
    with pytest.raises(InternalError) as caught:
        check_plan(lifetimes, _plan(lifetimes, [0, 48]))
    message = str(caught.value)
    assert message == (
        "unsound memory plan: %act (lifetime [2, 5], bytes [0, 64)) and "
        "%grad (lifetime [4, 7], bytes [48, 80)) are live at the same time and share bytes"
    )
    assert "\n" not in message
    assert caught.value.hint is not None and "report" in caught.value.hint


def test_checker_accepts_shared_bytes_when_lifetimes_are_disjoint() -> None:
    lifetimes = _lifetimes(("a", 64, 0, 3), ("b", 64, 4, 7), ("c", 64, 8, 9))
    check_plan(lifetimes, _plan(lifetimes, [0, 0, 0]))


def test_checker_catches_misplaced_tensors() -> None:
    lifetimes = _lifetimes(("a", 64, 0, 3))
    with pytest.raises(InternalError, match=r"misaligns %a .* multiple of 16"):
        check_plan(lifetimes, _plan(lifetimes, [8]))
    with pytest.raises(InternalError, match=r"%a .*bytes \[224, 288\)\) outside the arena of 256"):
        check_plan(lifetimes, _plan(lifetimes, [224]))
    with pytest.raises(InternalError, match="no offset for tensor %a"):
        check_plan(lifetimes, _plan(lifetimes, []))


# --------------------------------------------------------------------------
# Property: every plan is sound, no smaller than the bound, greedy <= naive.
# --------------------------------------------------------------------------

_tensor_specs = st.lists(
    st.tuples(st.integers(0, 300), st.integers(0, 30), st.integers(0, 10)), max_size=40
)


@settings(max_examples=300, deadline=None)
@given(specs=_tensor_specs, alignment=st.sampled_from([1, 4, 16, 64]))
def test_plans_are_sound_and_bounded(specs: list[tuple[int, int, int]], alignment: int) -> None:
    lifetimes = _lifetimes(*((f"t{i}", n, s, s + d) for i, (n, s, d) in enumerate(specs)))
    plans = {
        algorithm: plan_memory(lifetimes, alignment=alignment, algorithm=algorithm)
        for algorithm in ALGORITHMS
    }
    for plan in plans.values():
        check_plan(lifetimes, plan)
        assert plan.arena_bytes >= plan.lower_bound
        assert plan.arena_bytes % alignment == 0
    assert plans["greedy_by_size"].arena_bytes <= plans["naive"].arena_bytes
    # The best of several placements is never worse than any one of them.
    assert plans["greedy_best"].arena_bytes <= min(plans["greedy_by_size"].arena_bytes,
                                                   plans["shared_buffers"].arena_bytes)


# --------------------------------------------------------------------------
# Realistic graphs: exported models in out-variant form.
# --------------------------------------------------------------------------


def out_variant_program(program: ExportedProgram) -> ExportedProgram:
    """`program` (core ATen) in the out-variant form, converted in place.

    Each op node gets its out-variant overload with an `alloc` node per
    output; views without one (permute, expand, ...) become their `_copy`
    op; `aten.view` stays a view, which aliases its input.
    """
    program = program.run_decompositions()
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        if op is aten.view.default or not op._schema.returns:
            continue
        out_op = _out_overload(op)
        value = node.meta["val"]
        fakes = list(value) if isinstance(value, (tuple, list)) else [value]
        with graph.inserting_before(node):
            allocs = [graph.call_function(alloc, (_spec(fake),)) for fake in fakes]
        for new, fake in zip(allocs, fakes):
            new.meta["val"] = fake
        out_names = [arg.name for arg in out_op._schema.arguments if arg.is_out]
        node.target = out_op
        node.kwargs = {**node.kwargs, **dict(zip(out_names, allocs))}
    program.graph_module.recompile()
    return program


def _spec(fake: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    """The alloc argument, for running the graph eagerly: dynamic dims at their example size."""
    shape = tuple(d if isinstance(d, int) else int(d.node.hint) for d in fake.shape)
    return shape, fake.dtype


def _out_overload(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """The overload taking `op`'s arguments plus kwarg-only `Tensor(a!)` outs."""
    wanted = [arg.name for arg in op._schema.arguments]
    for packet_name in (op.overloadpacket.__name__, op.overloadpacket.__name__ + "_copy"):
        packet = getattr(aten, packet_name, None)
        for overload in packet.overloads() if packet is not None else []:
            candidate = getattr(packet, overload)
            args = candidate._schema.arguments
            outs = [a for a in args if a.kwarg_only and a.alias_info and a.alias_info.is_write]
            if outs and [a.name for a in args if a not in outs] == wanted:
                return candidate  # type: ignore[no-any-return]
    raise AssertionError(f"no out-variant for {op}")


def _user_inputs(program: ExportedProgram) -> set[str]:
    specs = program.graph_signature.input_specs
    return {s.arg.name for s in specs if s.kind == InputKind.USER_INPUT}


def _run(program: ExportedProgram, inputs: tuple[torch.Tensor, ...]) -> Any:
    """Run the out-variant graph eagerly (each `alloc` makes an empty tensor)."""
    state = {**program.state_dict, **program.constants}
    lifted = [s.target for s in program.graph_signature.input_specs if s.target is not None]
    with torch.no_grad():
        return program.graph_module(*[state[name] for name in lifted], *inputs)


def _export(name: str) -> tuple[ExportedProgram, tuple[torch.Tensor, ...]]:
    model = MODELS[name]
    dynamic_shapes = model.dynamic_shapes() if model.dynamic_shapes else None
    exported = torch.export.export(
        model.module(), model.inputs(), dynamic_shapes=dynamic_shapes, strict=False
    )
    return out_variant_program(exported), model.inputs()


def test_mlp_plan_reaches_the_lower_bound() -> None:
    program, inputs = _export("mlp")  # Linear(8, 16), relu, Linear(16, 4) on x: f32[2, 8]
    graph = program.graph_module.graph
    assert sum(map(is_alloc, graph.nodes)) == 5
    assert {n.target for n in graph.nodes if n.op == "call_function" and not is_alloc(n)} == {
        aten.permute_copy.out,
        aten.addmm.out,
        aten.relu.out,
    }
    with torch.no_grad():
        expected = MODELS["mlp"].module()(*inputs)
    torch.testing.assert_close(_run(program, inputs)[0], expected)

    lifetimes = tensor_lifetimes(graph, _user_inputs(program))
    # x 64, fc1.weight^T 512, fc1 out 128, relu 128, fc2.weight^T 256, fc2 out 32 bytes.
    assert sorted(lt.nbytes for lt in lifetimes) == [32, 64, 128, 128, 256, 512]
    greedy = plan_memory(lifetimes)
    check_plan(lifetimes, greedy)
    # Peak: x, fc1.weight^T and the fc1 output, live together at the first addmm.
    assert (greedy.arena_bytes, greedy.lower_bound) == (704, 704)
    assert plan_memory(lifetimes, algorithm="naive").arena_bytes == 1120


# Arena bytes our planner gives each model, and naive's, on our out-variant form.
REALISTIC = {
    "mlp": (704, 1120),
    "cnn": (2048, 4672),
    "attention": (896, 3040),
    "dynamic_add": (384, 576),
}


@pytest.mark.parametrize("name", list(REALISTIC))
def test_realistic_graphs(name: str) -> None:
    program, inputs = _export(name)
    lifetimes = tensor_lifetimes(
        program.graph_module.graph, _user_inputs(program), view_ops={aten.view.default}
    )
    greedy = plan_memory(lifetimes)
    naive = plan_memory(lifetimes, algorithm="naive")
    check_plan(lifetimes, greedy)
    check_plan(lifetimes, naive)
    assert (greedy.arena_bytes, naive.arena_bytes) == REALISTIC[name]
    assert greedy.arena_bytes == greedy.lower_bound
    with torch.no_grad():
        expected = MODELS[name].module()(*inputs)
    torch.testing.assert_close(_run(program, inputs)[0], expected)


# --------------------------------------------------------------------------
# The pass.
# --------------------------------------------------------------------------


def test_memory_plan_pass_annotates_planned_nodes() -> None:
    program, _ = _export("mlp")
    result = MemoryPlanPass().run(program)

    assert result.changed and result.program is program
    plan = memory_plan(program.graph_module)
    assert isinstance(plan, MemoryPlan)
    assert (plan.arena_bytes, plan.lower_bound, plan.alignment) == (704, 704, 16)
    planned = [n for n in program.graph_module.graph.nodes if planned_memory(n) is not None]
    assert {n.name for n in planned if not is_alloc(n)} == {"x"}  # weights are constants
    assert sum(map(is_alloc, planned)) == 5
    for node in planned:
        assert planned_memory(node) == (1, plan.offsets[node])
    assert MemoryPlanPass.name == "memory_plan"


def test_memory_plan_pass_options() -> None:
    program, _ = _export("mlp")
    MemoryPlanPass(alignment=64, algorithm="naive").run(program)
    plan = memory_plan(program.graph_module)
    assert (plan.algorithm, plan.arena_bytes) == ("naive", 1152)
    with pytest.raises(UsageError):
        MemoryPlanPass(algorithm="nope").run(program)


# --------------------------------------------------------------------------
# ExecuTorch as the yardstick: on ExecuTorch's own out-variant graph, our
# arena is never larger than the one it plans.
# --------------------------------------------------------------------------


def _executorch_graph(name: str) -> tuple[Graph, set[str], int, set[Any]]:
    """ExecuTorch's planned graph of model `name` with its allocs turned into ours.

    Returns the graph, its user inputs, ExecuTorch's arena size and its view ops.
    """
    exir = importlib.import_module("executorch.exir")
    memory = importlib.import_module("executorch.exir.memory")
    model = MODELS[name]
    dynamic_shapes = model.dynamic_shapes() if model.dynamic_shapes else None
    exported = torch.export.export(
        model.module(), model.inputs(), dynamic_shapes=dynamic_shapes, strict=False
    )
    manager = exir.to_edge(exported).to_executorch()
    arena = manager.executorch_program.execution_plan[0].non_const_buffer_sizes[1]
    program = manager.exported_program()
    graph = program.graph_module.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is memory.alloc:
            _retarget_alloc(graph, node)
    return graph, _user_inputs(program), arena, {memory.view}


def _retarget_alloc(graph: Graph, node: Node) -> None:
    """ExecuTorch's alloc of one spec becomes ours; one of a list of specs becomes one each."""
    specs = node.args[0]
    assert isinstance(specs, (tuple, list))
    if isinstance(specs[1], torch.dtype):
        node.target = alloc
        return
    with graph.inserting_before(node):
        allocs = [graph.call_function(alloc, (spec,)) for spec in specs]
    for new, fake in zip(allocs, node.meta["val"]):
        new.meta["val"] = fake
    for user in list(node.users):
        index = user.args[1] if user.target is operator.getitem else None
        if isinstance(index, int):
            user.replace_all_uses_with(allocs[index])
            graph.erase_node(user)
        else:
            user.kwargs = {k: allocs if v is node else v for k, v in user.kwargs.items()}
    graph.erase_node(node)


@pytest.mark.oracle
@pytest.mark.slow
@requires_executorch
@pytest.mark.parametrize("name", ["mlp", "cnn", "attention", "embed_cat", "dynamic_add"])
def test_arena_no_larger_than_executorch(name: str) -> None:
    graph, user_inputs, executorch_arena, view_ops = _executorch_graph(name)
    lifetimes = tensor_lifetimes(graph, user_inputs, view_ops=view_ops)
    plan = plan_memory(lifetimes)
    check_plan(lifetimes, plan)
    assert plan.arena_bytes <= executorch_arena
    assert plan.arena_bytes == plan.lower_bound
