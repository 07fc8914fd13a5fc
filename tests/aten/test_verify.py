"""The ATen dialect verifier: real exported programs pass, hand-corrupted ones fail by rule."""

from __future__ import annotations

import inspect
import operator
from typing import Any

import pytest
import torch
from torch.export import ExportedProgram

from exirc.aten import verify_aten
from exirc.errors import DialectError
from exirc.ir.source import parse_stack_trace, source_location, user_frame


class _Mlp(torch.nn.Module):
    offset: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.register_buffer("offset", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) + self.offset  # the line errors point at


@torch.library.custom_op("exirc_verify_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _twice_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_NO_FAKE = torch.library.Library("exirc_verify_nofake", "DEF")
_NO_FAKE.define("thrice(Tensor x) -> Tensor")
_NO_FAKE.impl("thrice", lambda x: x * 3, "CPU")


class _Branchy(torch.nn.Module):
    """cond with subgraphs, a custom op with a fake kernel and SymInt arithmetic."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        n = x.shape[0]
        y = _twice(x)
        z = torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (y,))
        return z.reshape(n * 3), n + 1


@pytest.fixture
def mlp() -> ExportedProgram:
    return torch.export.export(_Mlp().eval(), (torch.randn(2, 3),))


@pytest.fixture
def branchy() -> ExportedProgram:
    batch = torch.export.Dim("batch", min=2, max=64)
    return torch.export.export(_Branchy(), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))


def node_named(program: ExportedProgram, name: str) -> torch.fx.Node:
    return next(node for node in program.graph.nodes if node.name == name)


def broken(program: ExportedProgram) -> DialectError:
    with pytest.raises(DialectError) as raised:
        verify_aten(program)
    return raised.value


def _python_helper(x: Any) -> Any:
    return x


# --------------------------------------------------------------------------- valid programs


def test_exported_programs_pass(mlp: ExportedProgram, branchy: ExportedProgram) -> None:
    verify_aten(mlp)
    verify_aten(branchy)  # cond, getitem, sym_size, operator.mul/add on SymInts, custom op


def test_program_reloaded_from_pt2_passes(mlp: ExportedProgram, tmp_path: Any) -> None:
    path = tmp_path / "mlp.pt2"
    torch.export.save(mlp, str(path))
    verify_aten(torch.export.load(str(path)))


# --------------------------------------------------------------------------- broken programs


def test_node_without_val(mlp: ExportedProgram) -> None:
    del node_named(mlp, "relu").meta["val"]
    error = broken(mlp)
    message = str(error)
    first = message.splitlines()[0]
    assert first == ("ATen dialect, rule 'val': node %relu (call_function aten.relu.default): "
                     'node has no meta["val"] (its FakeTensor or SymInt value)')
    line = inspect.getsourcelines(_Mlp.forward)[1] + 1
    assert f"test_verify.py:{line}: return torch.relu(self.linear(x)) + self.offset" in message
    assert "  > %relu" in message  # the faulty node, marked in the IR shown
    assert error.exit_code == 3
    assert len(message.splitlines()) <= 8  # one line, where, and a window of five nodes


def test_placeholder_after_a_call(mlp: ExportedProgram) -> None:
    graph = mlp.graph
    linear = node_named(mlp, "linear")
    with graph.inserting_after(linear):
        late = graph.placeholder("late")
    late.meta["val"] = linear.meta["val"]
    message = str(broken(mlp))
    assert message.startswith("ATen dialect, rule 'placeholders': node %late (placeholder late): "
                              "placeholder comes after other nodes")


def test_python_function_target(mlp: ExportedProgram) -> None:
    graph = mlp.graph
    relu = node_named(mlp, "relu")
    with graph.inserting_after(relu):
        call = graph.call_function(_python_helper, (relu,))
    call.meta["val"] = relu.meta["val"]
    message = str(broken(mlp))
    assert message.startswith(
        f"ATen dialect, rule 'op': node %{call.name} (call_function "
        f"{__name__}._python_helper): calls a Python callable, not an ATen, higher-order or "
        "registered custom operator")


def test_two_outputs(mlp: ExportedProgram) -> None:
    graph = mlp.graph
    add = node_named(mlp, "add")
    graph.output((add,))
    message = str(broken(mlp))
    assert message.startswith("ATen dialect, rule 'output': node %output (output output): "
                              "output node is followed by 1 more node(s)")


def test_graph_not_ending_with_output(mlp: ExportedProgram) -> None:
    graph = mlp.graph
    output = next(node for node in graph.nodes if node.op == "output")
    relu = node_named(mlp, "relu")
    with graph.inserting_after(output):
        extra = graph.call_function(torch.ops.aten.neg.default, (relu,))
    extra.meta["val"] = relu.meta["val"]
    message = str(broken(mlp))
    assert "rule 'output'" in message and "%output" in message


def test_call_module_opcode(mlp: ExportedProgram) -> None:
    graph = mlp.graph
    relu = node_named(mlp, "relu")
    mlp.graph_module.add_submodule("act", torch.nn.ReLU())
    with graph.inserting_after(relu):
        call = graph.call_module("act", (relu,))
    message = str(broken(mlp))
    assert message.startswith(f"ATen dialect, rule 'opcode': node %{call.name} "
                              "(call_module act): call_module nodes are not part of the ATen "
                              "dialect")


def test_custom_op_without_fake_kernel(mlp: ExportedProgram) -> None:
    relu = node_named(mlp, "relu")
    relu.target = torch.ops.exirc_verify_nofake.thrice.default
    message = str(broken(mlp))
    assert "rule 'op': node %relu (call_function exirc_verify_nofake.thrice.default)" in message
    assert "has no Meta or fake kernel" in message


def test_overload_packet_target(mlp: ExportedProgram) -> None:
    node_named(mlp, "relu").target = torch.ops.aten.relu
    message = str(broken(mlp))
    assert "rule 'op'" in message
    assert "aten.relu is an overload packet, not an operator" in message


def test_operator_on_tensors(mlp: ExportedProgram) -> None:
    node_named(mlp, "add").target = operator.add
    message = str(broken(mlp))
    assert "rule 'op': node %add (call_function _operator.add)" in message
    assert "is allowed on SymInts only, but its value is FakeTensor" in message


def test_get_attr_of_a_parameter(mlp: ExportedProgram) -> None:
    graph = mlp.graph
    gm = mlp.graph_module
    gm.register_parameter("weight", torch.nn.Parameter(torch.ones(3, 3)))
    relu = node_named(mlp, "relu")
    with graph.inserting_before(relu):
        weight = graph.get_attr("weight")
    message = str(broken(mlp))
    assert message.startswith(f"ATen dialect, rule 'get_attr': node %{weight.name} "
                              "(get_attr weight): get_attr reads parameter 'weight'")
    assert "must be lifted to placeholders" in message


def test_signature_input_without_placeholder(mlp: ExportedProgram) -> None:
    node_named(mlp, "b_offset").name = "renamed"
    message = str(broken(mlp))
    assert "rule 'lifted'" in message
    assert "input 2 (buffer 'offset') is placeholder %b_offset, which the graph does not have" in (
        message)


def test_error_inside_a_cond_branch_names_the_subgraph(branchy: ExportedProgram) -> None:
    branch = branchy.graph_module.true_graph_0
    sin = next(node for node in branch.graph.nodes if node.op == "call_function")
    del sin.meta["val"]
    message = str(broken(branchy))
    assert message.startswith(f"ATen dialect, rule 'val': node %true_graph_0.{sin.name} ")


# --------------------------------------------------------------------------- source locations


def test_source_location_is_the_innermost_user_frame() -> None:
    stack = (
        '  File "/home/me/model.py", line 19, in forward\n'
        "    return x + helper(y)\n"
        '  File "/home/me/helpers.py", line 89, in helper\n'
        "    return torch.nn.functional.relu(y)\n"
        '  File "/usr/lib/python3/site-packages/torch/nn/functional.py", line 1500, in relu\n'
        "    result = torch.relu(input)\n"
    )
    frames = parse_stack_trace(stack)
    assert [f.line for f in frames] == [19, 89, 1500]
    frame = user_frame(frames)
    assert frame is not None and frame.file == "/home/me/helpers.py"
    assert str(frame) == "/home/me/helpers.py:89: return torch.nn.functional.relu(y)"


def test_source_location_ignores_generated_code(mlp: ExportedProgram) -> None:
    relu = node_named(mlp, "relu")
    relu.meta["stack_trace"] = '  File "<eval_with_key>.3", line 5, in forward\n    relu = ...\n'
    assert source_location(relu) is None
    del relu.meta["stack_trace"]
    assert source_location(relu) is None
