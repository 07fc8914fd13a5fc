"""The Edge passes, one at a time, on small torch.export-ed programs.

Each test runs a pass, checks the graph changed as intended, verifies the
dialect where the program is meant to be Edge, and compares the program's
outputs with eager PyTorch.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Node

from exirc.edge.constant_fold import ConstantFold
from exirc.edge.constants import constant_tensor
from exirc.edge.dead_code_elimination import DeadCodeElimination
from exirc.edge.remove_noop_copies import RemoveNoopCopies
from exirc.edge.scalars_to_tensors import ScalarsToTensors
from exirc.edge.to_edge import ToEdge
from exirc.edge.verify import verify_edge
from exirc.edge.views_to_copies import ViewsToCopies
from exirc.errors import DialectError
from exirc.passes.contract import Pass

aten = torch.ops.aten

EDGE_PASSES: tuple[Pass, ...] = (ToEdge(), ViewsToCopies(), ScalarsToTensors(),
                                 RemoveNoopCopies(), ConstantFold(), DeadCodeElimination())


# --------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------


def export(module: torch.nn.Module, *inputs: Any, dynamic_shapes: Any = None) -> ExportedProgram:
    return torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes,
                               strict=False)


def run(program: ExportedProgram, *passes: Pass) -> tuple[ExportedProgram, list[bool]]:
    """Run `passes` in order; the program and whether each changed it."""
    changed = []
    for p in passes:
        result = p.run(program)
        program = result.program
        changed.append(result.changed)
    return program, changed


def calls(program: ExportedProgram) -> list[Node]:
    return [n for n in program.graph_module.graph.nodes if n.op == "call_function"]


def targets(program: ExportedProgram) -> list[Any]:
    return [n.target for n in calls(program)]


def placeholders(program: ExportedProgram) -> list[str]:
    return [n.name for n in program.graph_module.graph.nodes if n.op == "placeholder"]


def spec_names(program: ExportedProgram, kind: InputKind | None = None) -> list[str]:
    return [s.arg.name for s in program.graph_signature.input_specs
            if kind is None or s.kind == kind]


def outputs(values: Any) -> list[torch.Tensor]:
    return list(values) if isinstance(values, (tuple, list)) else [values]


def assert_same_outputs(program: ExportedProgram, module: torch.nn.Module,
                        inputs: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        expected = outputs(module(*inputs))
        got = outputs(program.module()(*inputs))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e)


def assert_signature_in_step(program: ExportedProgram) -> None:
    """Placeholders, input specs and stored constants describe the same inputs."""
    assert placeholders(program) == spec_names(program)
    for spec in program.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            assert spec.target in program.state_dict or spec.target in program.constants, spec


def is_core(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.core in target.tags


# --------------------------------------------------------------------------
# Models.
# --------------------------------------------------------------------------


class NonCore(torch.nn.Module):
    """linear, silu, layer_norm, hardtanh: none of them core ATen ops as exported."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 5)
        self.norm = torch.nn.LayerNorm(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.silu(self.fc(x))
        return torch.nn.functional.hardtanh(self.norm(y), -0.5, 0.5)


class Views(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x.permute(2, 0, 1) + 1
        b = x.reshape(6, 4).t() * 2
        c = x[:, 1:, ::2].unsqueeze(0).expand(3, 2, 2, 2) - 1
        d = x.transpose(0, 1).select(0, 2).squeeze()
        return a, b, c, d


class Linear(torch.nn.Module):
    def __init__(self, din: int = 4, dout: int = 3) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(din, dout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


# --------------------------------------------------------------------------
# to_edge
# --------------------------------------------------------------------------


def test_to_edge_leaves_only_core_aten_ops() -> None:
    model, x = NonCore(), torch.randn(2, 6)
    program = export(model, x)
    before = targets(program)
    assert aten.linear.default in before and aten.silu.default in before
    assert not all(is_core(t) for t in before)

    program, changed = run(program, ToEdge())

    assert changed == [True]
    after = targets(program)
    assert aten.linear.default not in after and aten.silu.default not in after
    assert aten.addmm.default in after  # linear's decomposition
    non_core = [t for t in after if not is_core(t) and t is not operator.getitem]
    assert non_core == [], non_core
    assert_same_outputs(program, model, (x,))


def test_to_edge_keep_leaves_an_op_undecomposed() -> None:
    model, x = NonCore(), torch.randn(2, 6)
    program, _ = run(export(model, x), ToEdge(keep=("aten.linear.default",)))
    after = targets(program)
    assert after.count(aten.linear.default) == 1
    assert aten.addmm.default not in after
    assert aten.silu.default not in after  # everything else still decomposes
    assert_same_outputs(program, model, (x,))


# --------------------------------------------------------------------------
# views_to_copies
# --------------------------------------------------------------------------


def test_views_to_copies_replaces_every_view_with_its_copy_twin() -> None:
    model, x = Views(), torch.randn(2, 3, 4)
    program, _ = run(export(model, x), ToEdge())
    views = [n for n in calls(program) if isinstance(n.target, torch._ops.OpOverload)
             and n.target.is_view]
    assert {n.target for n in views} >= {aten.permute.default, aten.view.default}
    view_names = {n.name: n.target for n in views}

    program, changed = run(program, ViewsToCopies())

    assert changed == [True]
    remaining = [t for t in targets(program)
                 if isinstance(t, torch._ops.OpOverload) and t.is_view]
    assert remaining == []
    by_name = {n.name: n.target for n in calls(program)}
    for name, view in view_names.items():
        twin = by_name[name]
        assert twin.__name__ == view.__name__.replace(".", "_copy.", 1), (view, twin)
    assert any(by_name[n] is aten.permute_copy.default for n in view_names)
    assert_same_outputs(program, model, (x,))
    verify_edge(program)

    again = ViewsToCopies().run(program)
    assert not again.changed


# --------------------------------------------------------------------------
# scalars_to_tensors
# --------------------------------------------------------------------------


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5


def test_scalars_to_tensors_gives_a_number_a_0d_constant() -> None:
    model, x = Scale(), torch.randn(3, 2)
    program, _ = run(export(model, x), ToEdge(), ViewsToCopies())
    (mul,) = [n for n in calls(program) if n.target is aten.mul.Tensor]
    assert mul.args[1] == 0.5

    program, changed = run(program, ScalarsToTensors())

    assert changed == [True]
    (mul,) = [n for n in calls(program) if n.target is aten.mul.Tensor]
    constant = mul.args[1]
    assert isinstance(constant, Node) and constant.op == "placeholder"
    value = constant_tensor(program, constant)
    assert value is not None and value.dim() == 0 and value.item() == 0.5
    assert constant.name in spec_names(program, InputKind.CONSTANT_TENSOR)
    assert spec_names(program, InputKind.USER_INPUT) == ["x"]  # the signature is unchanged
    assert_signature_in_step(program)
    assert_same_outputs(program, model, (x,))
    verify_edge(program)


class ScalarOp(torch.nn.Module):
    def __init__(self, op: str, scalar: float | int | bool) -> None:
        super().__init__()
        self.op = op
        self.scalar = scalar

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.op == "add":
            return x + self.scalar
        if self.op == "mul":
            return x * self.scalar
        if self.op == "sub":
            return self.scalar - x
        return torch.where(x > 0, x, self.scalar)


@pytest.mark.parametrize(("op", "dtype", "scalar"), [
    ("mul", torch.int32, 0.5),      # an int tensor times a float: float32, not float64
    ("add", torch.int32, 2),        # an int32 tensor plus an int stays int32
    ("mul", torch.float16, 3),      # a half tensor times an int stays half
    ("sub", torch.float64, 1.25),   # a double tensor keeps its precision
    ("add", torch.uint8, 7),        # a byte tensor plus an int stays uint8
    ("where", torch.float32, -1.0),
])
def test_scalars_to_tensors_keeps_result_dtypes(op: str, dtype: torch.dtype,
                                                scalar: float) -> None:
    model = ScalarOp(op, scalar)
    x = (torch.arange(-3, 3).reshape(2, 3) * 3).to(dtype)
    if dtype == torch.uint8:
        x = x.abs()
    program, _ = run(export(model, x), ToEdge(), ViewsToCopies(), ScalarsToTensors())
    for node in calls(program):
        schema = node.target._schema  # type: ignore[union-attr]
        for argument, value in zip(schema.arguments, node.args):
            if str(argument.type) == "Tensor":
                assert not isinstance(value, (int, float, bool)), (node, argument.name)
    assert_same_outputs(program, model, (x,))
    verify_edge(program)


# --------------------------------------------------------------------------
# remove_noop_copies
# --------------------------------------------------------------------------


class SameShapeReshape(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = (x + 1).reshape(2, 3)      # [2, 3] -> [2, 3]: copies nothing
        z = (x * 2).reshape(3, 2)      # a real reshape
        return y.exp(), z.relu()


def test_remove_noop_copies_drops_a_reshape_to_the_same_shape() -> None:
    model, x = SameShapeReshape(), torch.randn(2, 3)
    program, _ = run(export(model, x), ToEdge(), ViewsToCopies())
    copies = [n for n in calls(program) if n.target is aten.view_copy.default]
    assert [tuple(n.meta["val"].shape) for n in copies] == [(2, 3), (3, 2)]
    count = len(calls(program))

    program, changed = run(program, RemoveNoopCopies())

    assert changed == [True]
    copies = [n for n in calls(program) if n.target is aten.view_copy.default]
    assert [tuple(n.meta["val"].shape) for n in copies] == [(3, 2)]
    assert len(calls(program)) == count - 1
    (exp,) = [n for n in calls(program) if n.target is aten.exp.default]
    assert exp.args[0].target is aten.add.Tensor  # type: ignore[union-attr]
    assert_same_outputs(program, model, (x,))
    verify_edge(program)


class ReturnsCopies(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.reshape(2, 3), x.clone()


def test_remove_noop_copies_keeps_a_copy_the_method_returns() -> None:
    model, x = ReturnsCopies(), torch.randn(2, 3)
    program, _ = run(export(model, x), ToEdge(), ViewsToCopies())
    before = targets(program)
    assert set(before) == {aten.view_copy.default, aten.clone.default}

    program, changed = run(program, RemoveNoopCopies())

    assert changed == [False]
    assert targets(program) == before
    (output,) = [n for n in program.graph_module.graph.nodes if n.op == "output"]
    assert all(isinstance(o, Node) and o.op == "call_function" for o in output.args[0])
    got = program.module()(x)
    assert all(g.data_ptr() != x.data_ptr() for g in got)  # outputs never alias the input
    assert_same_outputs(program, model, (x,))


class CopiesIntoBuffers(torch.nn.Module):
    """transformers' static cache, functionalized: each layer's `cumulative_length`
    (a tensor attribute, which export keeps as `copy(dst, src)`) takes
    `cache_position[0]`, and each layer computes its positions from its own."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("first", torch.zeros((), dtype=torch.long))
        self.register_buffer("second", torch.zeros((), dtype=torch.long))
        self.register_buffer("row", torch.zeros(3))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        first = torch.ops.aten.copy(self.first, positions[0])
        second = torch.ops.aten.copy(self.second, positions[0])
        row = torch.ops.aten.copy(self.row, x[0, 0])  # a broadcast: a new shape
        steps = torch.arange(positions.shape[0])
        return (steps + first) * 10 + (steps + second) + row.sum().long()


def test_remove_noop_copies_drops_a_copy_into_a_buffer_of_the_sources_shape() -> None:
    from exirc.edge.common_subexpressions import CommonSubexpressions
    from exirc.edge.remove_assertions import RemoveAssertions

    model, positions, x = CopiesIntoBuffers(), torch.tensor([7, 8, 9]), torch.randn(2, 3)
    program, _ = run(export(model, positions, x), ToEdge(), RemoveAssertions(), ViewsToCopies())
    assert targets(program).count(aten.copy.default) == 3
    assert targets(program).count(aten.add.Tensor) == 4

    program, changed = run(program, RemoveNoopCopies(), CommonSubexpressions())

    assert changed == [True, True]
    (kept,) = [n for n in calls(program) if n.target is aten.copy.default]
    assert tuple(kept.meta["val"].shape) == (3,)  # the broadcast stays
    # Both layers' positions now read the select itself: one add, not two.
    assert targets(program).count(aten.add.Tensor) == 3
    assert_same_outputs(program, CopiesIntoBuffers(), (positions, x))
    verify_edge(program)


# --------------------------------------------------------------------------
# constant_fold (+ dead_code_elimination)
# --------------------------------------------------------------------------


def test_constant_fold_turns_a_weight_permute_into_a_new_constant() -> None:
    model, x = Linear(), torch.randn(2, 4)
    program, _ = run(export(model, x), ToEdge(), ViewsToCopies())
    (permute,) = [n for n in calls(program) if n.target is aten.permute_copy.default]
    weight = permute.args[0]
    assert isinstance(weight, Node) and weight.name == "p_fc_weight"

    program, changed = run(program, ConstantFold())

    assert changed == [True]
    assert aten.permute_copy.default not in targets(program)
    (addmm,) = [n for n in calls(program) if n.target is aten.addmm.default]
    folded = addmm.args[2]
    assert isinstance(folded, Node) and folded.op == "placeholder"
    assert folded.name in spec_names(program, InputKind.CONSTANT_TENSOR)
    value = constant_tensor(program, folded)
    assert value is not None and value.is_contiguous()
    torch.testing.assert_close(value, model.fc.weight.detach().t(), rtol=0, atol=0)
    assert_same_outputs(program, model, (x,))
    assert "p_fc_weight" in placeholders(program)  # unread now, dropped by DCE

    program, changed = run(program, DeadCodeElimination())

    assert changed == [True]
    assert "p_fc_weight" not in placeholders(program)
    assert "p_fc_weight" not in spec_names(program)
    assert "fc.weight" not in program.state_dict
    assert "fc.bias" in program.state_dict  # still read by addmm
    assert_signature_in_step(program)
    assert_same_outputs(program, model, (x,))
    verify_edge(program)


class ConstantChain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = (self.w.t() * 2 + 1).relu()   # depends on the parameter only
        return x @ w, x.sum() + self.w.sum()


def test_constant_fold_keeps_only_the_frontier() -> None:
    model, x = ConstantChain(), torch.randn(2, 4)
    program, _ = run(export(model, x), *EDGE_PASSES[:4])

    program, changed = run(program, ConstantFold(), DeadCodeElimination())

    assert changed == [True, True]
    folded = [n for n in placeholders(program) if n.startswith("_folded_")]
    assert len(folded) == 2  # (relu of the chain) and (the sum), nothing in between
    remaining = targets(program)
    assert aten.relu.default not in remaining and aten.permute_copy.default not in remaining
    assert aten.mm.default in remaining
    assert "p_w" not in placeholders(program)
    assert_signature_in_step(program)
    assert_same_outputs(program, model, (x,))
    verify_edge(program)


class Random(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Random ops on constants: must run (and differ) on every call.
        noise = torch.nn.functional.dropout(self.w, 0.5, training=True)
        return x + noise, x * torch.bernoulli(torch.full_like(x, 0.5))


def test_constant_fold_never_folds_random_ops() -> None:
    x = torch.ones(4, 4)
    program, _ = run(export(Random(), x), ToEdge(), ViewsToCopies(), ScalarsToTensors())
    random_before = [n.name for n in calls(program)
                     if isinstance(n.target, torch._ops.OpOverload)
                     and torch.Tag.nondeterministic_seeded in n.target.tags]
    assert random_before  # native_dropout on the parameter, rand for bernoulli

    program, _ = run(program, ConstantFold(), DeadCodeElimination())

    random_after = [n.name for n in calls(program)
                    if isinstance(n.target, torch._ops.OpOverload)
                    and torch.Tag.nondeterministic_seeded in n.target.tags]
    assert random_after == random_before
    assert not any(name.startswith("_folded_") for name in placeholders(program))
    module = program.module()
    first, second = module(x), module(x)
    assert not torch.equal(first[0], second[0]) or not torch.equal(first[1], second[1])


@pytest.mark.parametrize(("slack", "folds"), [(-1, False), (0, True)])
def test_constant_fold_respects_max_bytes(slack: int, folds: bool) -> None:
    model, x = Linear(8, 16), torch.randn(2, 8)
    program, _ = run(export(model, x), ToEdge(), ViewsToCopies())
    limit = model.fc.weight.nbytes + slack   # 512 bytes: the permuted weight's size

    program, changed = run(program, ConstantFold(max_bytes=limit), DeadCodeElimination())

    assert changed[0] is folds
    assert (aten.permute_copy.default not in targets(program)) is folds
    assert ("p_fc_weight" not in placeholders(program)) is folds
    assert_same_outputs(program, model, (x,))


class MutatedBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.arange(6.0).reshape(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.state.t() * 2     # reads the buffer before this call's update
        self.state.add_(1.0)
        return y


def test_constant_fold_leaves_mutated_buffers_alone() -> None:
    x = torch.zeros(3, 2)
    program, _ = run(export(MutatedBuffer(), x), *EDGE_PASSES[:4])
    before = targets(program)

    program, changed = run(program, ConstantFold(), DeadCodeElimination())

    assert changed == [False, False]
    assert targets(program) == before
    eager = MutatedBuffer()
    module = program.module()
    for _ in range(2):  # the state advances on every call, in both
        torch.testing.assert_close(module(x), eager(x))


# --------------------------------------------------------------------------
# dead_code_elimination
# --------------------------------------------------------------------------


class Unused(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Parameter(torch.randn(3))
        self.unused = torch.nn.Parameter(torch.randn(3))
        self.register_buffer("also_unused", torch.zeros(3))

    def forward(self, x: torch.Tensor, ignored: torch.Tensor) -> torch.Tensor:
        return x * self.used


def test_dead_code_elimination_drops_unused_nodes_and_constants_keeps_inputs() -> None:
    model, inputs = Unused(), (torch.randn(3), torch.randn(2))
    program, _ = run(export(model, *inputs), ToEdge())
    graph = program.graph_module.graph
    (mul,) = [n for n in calls(program) if n.target is aten.mul.Tensor]
    with graph.inserting_after(mul):
        dead = graph.call_function(aten.neg.default, (mul,))
    with graph.inserting_after(dead):
        dead_too = graph.call_function(aten.exp.default, (dead,))
    dead.meta["val"] = dead_too.meta["val"] = mul.meta["val"]
    assert {"p_unused", "b_also_unused", "ignored"} <= set(placeholders(program))
    assert len(calls(program)) == 3

    program, changed = run(program, DeadCodeElimination())

    assert changed == [True]
    assert targets(program) == [aten.mul.Tensor]
    assert placeholders(program) == ["p_used", "x", "ignored"]
    assert spec_names(program, InputKind.USER_INPUT) == ["x", "ignored"]
    assert set(program.state_dict) == {"used"}
    assert_signature_in_step(program)
    assert_same_outputs(program, model, inputs)
    assert not DeadCodeElimination().run(program).changed  # nothing left to remove


# --------------------------------------------------------------------------
# The Edge verifier
# --------------------------------------------------------------------------


class LinearCall(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.w)  # the non-core op


def test_verify_edge_rejects_a_non_core_op_naming_node_and_line() -> None:
    program = export(LinearCall(), torch.randn(2, 4))
    with pytest.raises(DialectError) as raised:
        verify_edge(program)
    message = str(raised.value)
    assert message.startswith("node %linear (aten.linear.default)")
    assert "is not an Edge op" in message
    assert "test_passes.py:" in message
    assert "torch.nn.functional.linear(x, self.w)" in message
    assert "to_edge" in (raised.value.hint or "")


class Permute(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(1, 0) + 1


def test_verify_edge_rejects_a_view_op() -> None:
    program, _ = run(export(Permute(), torch.randn(2, 3)), ToEdge())
    with pytest.raises(DialectError) as raised:
        verify_edge(program)
    message = str(raised.value)
    assert message.startswith("node %permute (aten.permute.default)")
    assert "is not an Edge op" in message
    assert "views_to_copies" in (raised.value.hint or "")

    program, _ = run(program, ViewsToCopies())
    verify_edge(program)  # the copy twin is admitted


def test_full_edge_stage_on_a_small_model() -> None:
    model, x = NonCore(), torch.randn(2, 6)
    program, changed = run(export(model, x), *EDGE_PASSES)
    assert changed[0] and changed[1]
    verify_edge(program)
    assert_signature_in_step(program)
    assert_same_outputs(program, model, (x,))


class DynamicReshape(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0] * 2, -1) + 1


def test_verify_edge_admits_size_arithmetic_under_dynamic_shapes() -> None:
    # torch.export leaves `sym_size(x, 0) * 2` as Python arithmetic; it stays in Edge
    # until the backend's sym_prims pass (the Backend verifier rejects leftovers).
    model, x = DynamicReshape(), torch.randn(4, 4)
    batch = torch.export.Dim("batch", min=2, max=16)
    program, _ = run(export(model, x, dynamic_shapes=({0: batch},)), *EDGE_PASSES)
    assert operator.mul in targets(program)
    verify_edge(program)
    for size in (2, 9):
        assert_same_outputs(program, model, (torch.randn(size, 4),))


class ExpandedWeight(torch.nn.Module):
    """A [1, 64] parameter expanded to [64, 64] and transposed before use."""

    def __init__(self) -> None:
        super().__init__()
        self.row = torch.nn.Parameter(torch.randn(1, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.row.t().expand(64, 64)


def test_constant_fold_does_not_store_what_grows() -> None:
    model, x = ExpandedWeight(), torch.randn(64, 64)
    program, _ = run(export(model, x), ToEdge(), ViewsToCopies())

    program, changed = run(program, ConstantFold(), DeadCodeElimination())

    # The transpose folds (same bytes); the expand stays a run-time copy, so
    # no 16 KiB constant replaces the 256-byte parameter.
    assert changed[0] is True
    assert targets(program) == [aten.expand_copy.default, aten.add.Tensor]
    stored = [constant_tensor(program, n) for n in program.graph_module.graph.nodes
              if n.op == "placeholder"]
    assert max(t.nbytes for t in stored if t is not None) == model.row.nbytes
    assert_same_outputs(program, model, (x,))


class ScaledBroadcastWeight(torch.nn.Module):
    """A weight broadcast over 16 steps, then scaled and summed over them, as an
    unrolled recurrence's input projection reads it (`expand(w) * 2` is as big
    as the expand it multiplies: growth must be judged against the weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(48, 128))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        spread = self.w.expand(16, 48, 128).contiguous() * 2.0
        return torch.bmm(x, spread), x.sum(1) @ spread.sum(0)


def test_constant_fold_does_not_store_what_a_broadcast_grew() -> None:
    model, x = ScaledBroadcastWeight(), torch.randn(16, 2, 48)
    program, _ = run(export(model, x), *EDGE_PASSES[:4])

    program, changed = run(program, ConstantFold(), DeadCodeElimination())

    # The broadcast and its scaling run at run time on the 24 KiB weight; the
    # sum over the broadcast is no bigger than the weight, so it is stored.
    assert changed[0] is True
    assert aten.expand_copy.default in targets(program)
    assert targets(program).count(aten.sum.dim_IntList) == 1  # x's, not the weight's
    stored = [constant_tensor(program, n) for n in program.graph_module.graph.nodes
              if n.op == "placeholder"]
    assert max(t.nbytes for t in stored if t is not None) == model.w.nbytes
    assert_same_outputs(program, model, (x,))
    verify_edge(program)


class CausalMask(torch.nn.Module):
    """A causal mask built from `arange` (as transformers builds it): nothing in it
    depends on the input, so all of it is computed once, at compile time."""

    def __init__(self, positions: int) -> None:
        super().__init__()
        self.positions = positions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(self.positions)
        allowed = rows[None, :] <= rows[:, None]
        return torch.where(allowed, x, torch.full_like(x, -1.0))


def test_constant_fold_computes_masks_made_from_nothing() -> None:
    model, x = CausalMask(8), torch.randn(8, 8)
    program, _ = run(export(model, x), *EDGE_PASSES[:4])
    assert aten.arange.start_step in targets(program)

    program, changed = run(program, ConstantFold(), DeadCodeElimination())

    assert changed[0] is True
    assert targets(program) == [aten.full_like.default, aten.where.self]
    mask = [constant_tensor(program, n) for n in program.graph_module.graph.nodes
            if n.op == "placeholder" and n.name.startswith("_folded_")]
    assert any(t is not None and t.dtype == torch.bool and t.shape == (8, 8) for t in mask)
    assert_same_outputs(program, model, (x,))
    verify_edge(program)


def test_constant_fold_leaves_big_values_made_from_nothing_to_run_time() -> None:
    # A 300x300 mask is 90 KB: over the bound for values no constant contributes
    # to, so the file does not grow by it and the comparison stays an instruction;
    # the 2.4 KB of positions it compares are stored.
    model, x = CausalMask(300), torch.randn(300, 300)
    program, _ = run(export(model, x), *EDGE_PASSES[:4])

    program, _ = run(program, ConstantFold(), DeadCodeElimination())

    assert targets(program) == [aten.le.Tensor, aten.full_like.default, aten.where.self]
    stored = [constant_tensor(program, n) for n in program.graph_module.graph.nodes
              if n.op == "placeholder"]
    assert max(t.nbytes for t in stored if t is not None) == 300 * 8
    assert_same_outputs(program, model, (x,))


def test_constant_fold_never_folds_ops_without_defined_contents() -> None:
    from exirc.edge.constant_fold import _is_foldable_op

    assert not _is_foldable_op(aten.empty.memory_format)
    assert not _is_foldable_op(aten.empty_strided.default)
    assert _is_foldable_op(aten.arange.start_step)
    assert _is_foldable_op(aten.full.default)


class HugeFromNothing(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.zeros(8192, 8192).sum()  # 256 MiB made from nothing


def test_constant_fold_never_allocates_a_huge_value_made_from_nothing() -> None:
    # The zeros are over max_bytes: the compiler does not make them (the budget
    # is set far below them here, so evaluating them would show as a fold).
    x = torch.randn(3)
    program, _ = run(export(HugeFromNothing(), x), *EDGE_PASSES[:4])

    program, changed = run(program, ConstantFold(max_bytes=1 << 20), DeadCodeElimination())

    assert changed == [False, False]
    assert aten.full.default in targets(program)  # zeros, as export writes them
    assert_same_outputs(program, HugeFromNothing(), (x,))
