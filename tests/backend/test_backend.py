"""The Backend stage: the op registry, fusion, SymInt prims and the verifier."""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.experimental.proxy_tensor import make_fx

import exirc.backend.ops as backend_ops
from exirc.backend.fuse import Fuse, pattern_graph
from exirc.backend.ops import REGISTRY, BackendOp, addmm_relu, bind_pattern_to_op
from exirc.backend.sym_prims import PRIMS, SymPrims
from exirc.backend.verify import verify_backend
from exirc.edge.constant_fold import ConstantFold
from exirc.edge.dead_code_elimination import DeadCodeElimination
from exirc.edge.remove_noop_copies import RemoveNoopCopies
from exirc.edge.scalars_to_tensors import ScalarsToTensors
from exirc.edge.to_edge import ToEdge
from exirc.edge.verify import verify_edge
from exirc.edge.views_to_copies import ViewsToCopies
from exirc.errors import DialectError, UsageError
from exirc.runtime.kernels.registry import KERNELS
from tests.oracle import MLP

aten = torch.ops.aten


def edge_program(module: torch.nn.Module, *inputs: Any,
                 dynamic_shapes: Any = None) -> ExportedProgram:
    """`module` exported and taken through the Edge passes of the default pipeline."""
    program = torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes,
                                  strict=False)
    for p in (ToEdge(), ViewsToCopies(), ScalarsToTensors(), RemoveNoopCopies(),
              ConstantFold(), DeadCodeElimination()):
        program = p.run(program).program
    verify_edge(program)
    return program


def calls(program: ExportedProgram) -> list[Node]:
    return [n for n in program.graph_module.graph.nodes if n.op == "call_function"]


def targets(program: ExportedProgram) -> list[Any]:
    return [n.target for n in calls(program)]


def call_targets(graph: torch.fx.Graph) -> list[Any]:
    return [n.target for n in graph.nodes if n.op == "call_function"]


def assert_same_outputs(program: ExportedProgram, module: torch.nn.Module,
                        *inputs: torch.Tensor) -> None:
    with torch.no_grad():
        expected = module(*inputs)
        got = program.module()(*inputs)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e)


# --------------------------------------------------------------------------
# The registry.
# --------------------------------------------------------------------------


def test_bind_pattern_to_op_makes_the_pattern_the_reference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_ops, "REGISTRY", dict(REGISTRY))

    @bind_pattern_to_op("exirc_test::scale_add.out(Tensor self, Tensor other, float alpha, *, "
                        "Tensor(a!) out) -> Tensor(a!)")
    def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return aten.add.Tensor(aten.mul.Tensor(x, alpha), y)

    assert isinstance(scale_add, BackendOp)
    assert backend_ops.REGISTRY["exirc_test::scale_add.out"] is scale_add
    assert "exirc_test::scale_add.out" not in REGISTRY  # only the patched registry changed
    assert scale_add.qualified_name == "exirc_test::scale_add"
    assert scale_add.kernel_name == ("exirc_test::scale_add", "out")
    assert scale_add.out_names == ("out",)
    assert repr(scale_add) == "exirc_test::scale_add.out"
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    expected = x * 1.5 + y
    torch.testing.assert_close(scale_add(x, y, 1.5), expected)
    torch.testing.assert_close(scale_add.pattern(x, y, 1.5), expected)
    # An `out=` argument (as an out-variant call passes it) goes to the kernel, not the pattern.
    torch.testing.assert_close(scale_add(x, y, 1.5, out=torch.empty(3, 4)), expected)
    assert call_targets(pattern_graph(scale_add)) == [aten.mul.Tensor, aten.add.Tensor]


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 5), (4, 8, 16)])
def test_addmm_relu_is_its_pattern_and_its_kernel_agrees(shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    bias, mat1, mat2 = torch.randn(n), torch.randn(m, k), torch.randn(k, n)
    eager = torch.relu(torch.addmm(bias, mat1, mat2))
    assert REGISTRY["exirc::addmm_relu.out"] is addmm_relu
    assert torch.equal(addmm_relu(bias, mat1, mat2), addmm_relu.pattern(bias, mat1, mat2))
    torch.testing.assert_close(addmm_relu(bias, mat1, mat2), eager)
    kernel = KERNELS.find(*addmm_relu.kernel_name)  # the runtime's own (exirc_ops)
    assert kernel is not None and kernel.schema == addmm_relu._schema
    out = torch.full((m, n), float("nan"))
    returned = kernel.fn(bias, mat1, mat2, out=out)
    assert returned is out
    torch.testing.assert_close(out, eager)
    assert (out >= 0).all()


def test_addmm_relu_schema_is_an_out_variant() -> None:
    schema = addmm_relu._schema
    assert schema.name == "exirc::addmm_relu" and schema.overload_name == "out"
    assert [a.name for a in schema.arguments] == ["self", "mat1", "mat2", "out"]
    assert [a.is_out for a in schema.arguments] == [False, False, False, True]
    assert [p.name for p in pattern_graph(addmm_relu).nodes if p.op == "placeholder"] == \
        ["bias", "mat1", "mat2"]


# --------------------------------------------------------------------------
# Fusion.
# --------------------------------------------------------------------------


class SharedLinear(torch.nn.Module):
    """The linear's output is also returned: fusing would compute it twice."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc1(x)
        return self.fc2(torch.relu(h)), h


def test_fuse_replaces_addmm_relu_in_an_mlp() -> None:
    model, x = MLP(), torch.randn(2, 8)
    program = edge_program(model, x)
    before = calls(program)
    assert [n.target for n in before] == [aten.addmm.default, aten.relu.default,
                                          aten.addmm.default]
    first_addmm = before[0]
    bound_args = first_addmm.args

    result = Fuse(patterns=("linear_relu",)).run(program)

    assert result.changed
    program = result.program
    after = calls(program)
    assert [n.target for n in after] == [addmm_relu, aten.addmm.default]
    fused = after[0]
    assert fused.args == bound_args  # (bias, x, permuted weight), in the pattern's order
    assert after[1].args[1] is fused
    verify_backend(program)
    assert_same_outputs(program, model, x)
    assert not Fuse().run(program).changed  # nothing left to fuse


def test_retracing_a_fused_op_recovers_the_subgraph_it_replaced() -> None:
    model, x = MLP(), torch.randn(2, 8)
    program = edge_program(model, x)
    (relu,) = [n for n in calls(program) if n.target is aten.relu.default]
    replaced = [relu.args[0], relu]  # what the fusion will replace, in order
    replaced_targets = [n.target for n in replaced]
    unfused = call_targets(make_fx(program.module())(x).graph)

    program = Fuse().run(program).program

    assert call_targets(pattern_graph(addmm_relu)) == replaced_targets
    assert addmm_relu in targets(program)
    # Tracing the fused program runs the op's pattern, so the fusion undoes itself.
    retraced = call_targets(make_fx(program.module())(x).graph)
    assert retraced == unfused
    assert [t for t in retraced if t in (aten.addmm.default, aten.relu.default)] == \
        [aten.addmm.default, aten.relu.default, aten.addmm.default]


def test_fuse_leaves_an_addmm_with_another_user() -> None:
    model, x = SharedLinear(), torch.randn(2, 8)
    program = edge_program(model, x)
    before = targets(program)
    assert before.count(aten.relu.default) == 1

    result = Fuse().run(program)

    assert not result.changed
    assert targets(result.program) == before
    assert addmm_relu not in targets(result.program)
    assert_same_outputs(result.program, model, x)


def test_fuse_rejects_an_unknown_pattern_name() -> None:
    program = edge_program(MLP(), torch.randn(2, 8))
    with pytest.raises(UsageError) as raised:
        Fuse(patterns=("linear_relu", "conv_bn")).run(program)
    assert str(raised.value) == "unknown fusion pattern(s) ['conv_bn']"
    assert raised.value.hint == "known: linear_relu"


# --------------------------------------------------------------------------
# SymInt prims and the Backend verifier.
# --------------------------------------------------------------------------


class SizeArithmetic(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = x.view(x.shape[0] * 2, -1)
        half = x.new_zeros(x.shape[0] // 2, 3) + 1
        return pairs, half


def _dynamic_program() -> ExportedProgram:
    batch = torch.export.Dim("batch", min=4, max=16)
    return edge_program(SizeArithmetic(), torch.randn(4, 4), dynamic_shapes=({0: batch},))


def test_sym_prims_turn_symint_operators_into_prim_ops() -> None:
    program = _dynamic_program()
    python_ops = {n.name: n.target for n in calls(program)
                  if n.target in (operator.mul, operator.floordiv)}
    assert sorted(python_ops.values(), key=str) == [operator.floordiv, operator.mul]

    result = SymPrims().run(program)

    assert result.changed
    program = result.program
    by_name = {n.name: n.target for n in calls(program)}
    for name, python_op in python_ops.items():
        prim = by_name[name]
        assert isinstance(prim, BackendOp) and prim is PRIMS[python_op]
        assert prim.qualified_name == f"executorch_prim::{python_op.__name__}"
        assert repr(prim) == f"executorch_prim::{python_op.__name__}.Scalar"
        assert prim.pattern is python_op
    assert not any(t in (operator.mul, operator.floordiv) for t in targets(program))
    verify_backend(program)
    module = program.module()
    for batch in (4, 7, 16):
        x = torch.randn(batch, 4)
        pairs, half = module(x)
        assert torch.equal(pairs, x.view(batch * 2, -1))
        assert torch.equal(half, torch.ones(batch // 2, 3))
    assert not SymPrims().run(program).changed


def test_sym_prims_leave_static_programs_alone() -> None:
    program = edge_program(MLP(), torch.randn(2, 8))
    before = targets(program)
    result = SymPrims().run(program)
    assert not result.changed
    assert targets(result.program) == before


def test_verify_backend_rejects_a_leftover_python_operator() -> None:
    program = _dynamic_program()  # the Edge verifier admits size arithmetic...
    with pytest.raises(DialectError) as raised:
        verify_backend(program)  # ...the Backend verifier does not
    message = str(raised.value)
    first = next(n for n in calls(program) if n.target in (operator.mul, operator.floordiv))
    assert message.startswith(f"node %{first.name} (<built-in function {first.target.__name__}>)")
    assert "is neither an Edge op nor a registered backend op" in message
    assert "test_backend.py:" in message and "x.shape[0] * 2" in message
    assert "sym_prims" in (raised.value.hint or "")


def test_verify_backend_rejects_an_unregistered_call() -> None:
    program = edge_program(MLP(), torch.randn(2, 8))
    (relu,) = [n for n in calls(program) if n.target is aten.relu.default]
    relu.target = torch.relu  # a Python function, not an op of any dialect
    with pytest.raises(DialectError, match=r"^node %relu \(<built-in method relu"):
        verify_backend(program)
